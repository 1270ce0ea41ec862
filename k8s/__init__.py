"""Kubernetes manifests for nvrx-eks, synthesized with cdk8s from the shared profile.

`python -m k8s synth --profile NAME [--mode MODE] [--outputs cdk-outputs.json] --outdir dist/`
"""

import os

# jsii prints a large end-of-life banner for node 20 on every import of cdk8s; the banner says
# nothing about our manifests, so silence it before cdk8s is first imported.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from k8s.deployment import Deployment, resolve  # noqa: E402
from k8s.errors import SynthError  # noqa: E402
from k8s.outputs import StackOutputs, load_outputs  # noqa: E402

__all__ = ["Deployment", "StackOutputs", "SynthError", "load_outputs", "resolve"]
