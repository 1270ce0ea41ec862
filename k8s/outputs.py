"""The CDK outputs file: `cdk deploy --outputs-file` writes {"<Stack>": {"<Key>": "value"}}.

Several stacks write into one file; their keys are merged into one flat mapping. A key that two
stacks report with different values is an error (the file mixes two deployments).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from config import contract
from k8s.errors import SynthError

DEFAULT_OUTPUTS_FILE = "cdk-outputs.json"

# Keys of the infra contract that this package reads.
CLUSTER_NAME = contract.OUTPUT_CLUSTER_NAME
KUBECONFIG_COMMAND = contract.OUTPUT_KUBECONFIG_COMMAND
REGION = contract.OUTPUT_REGION
NAMESPACE = contract.OUTPUT_NAMESPACE
FSX_PVC_NAME = contract.OUTPUT_FSX_PVC_NAME
ECR_REPOSITORY_URI = contract.OUTPUT_ECR_REPOSITORY_URI
NODE_LOCAL_DIR = contract.OUTPUT_NODE_LOCAL_DIR


@dataclass(frozen=True)
class StackOutputs:
    """Merged stack outputs, and where they came from (for error messages)."""

    values: Mapping[str, str] = field(default_factory=dict)
    source: Path | None = None

    def get(self, key: str) -> str | None:
        value = self.values.get(key)
        return value if value else None

    def require(self, key: str, why: str) -> str:
        """The value of `key`, or a one-line error naming the key and what needs it."""
        value = self.get(key)
        if value is None:
            where = (
                f"not in {self.source}"
                if self.source is not None
                else f"no outputs file was given (pass --outputs {DEFAULT_OUTPUTS_FILE})"
            )
            raise SynthError(f"missing required value {key!r} ({why}): {where}")
        return value


def merge_stacks(data: object, source: Path) -> dict[str, str]:
    """Flatten {"Stack": {"Key": "value"}} into {"Key": "value"}; conflicting duplicates fail."""
    if not isinstance(data, dict):
        raise SynthError(f"outputs file {source} must map stack names to their outputs")
    merged: dict[str, str] = {}
    origin: dict[str, str] = {}
    for stack, outputs in data.items():
        if not isinstance(outputs, dict):
            raise SynthError(f"outputs file {source}: stack {stack!r} must map output keys to values")
        for key, value in outputs.items():
            text = str(value)
            if key in merged and merged[key] != text:
                raise SynthError(
                    f"outputs file {source}: {key!r} is {merged[key]!r} in stack {origin[key]!r} "
                    f"but {text!r} in stack {stack!r}"
                )
            merged[key] = text
            origin.setdefault(key, stack)
    return merged


def load_outputs(path: str | Path | None) -> StackOutputs:
    """Read and merge an outputs file; None means no file (only the profile is used)."""
    if path is None:
        return StackOutputs()
    source = Path(path)
    if not source.is_file():
        raise SynthError(f"outputs file {source} not found (run `cdk deploy --outputs-file {source}`)")
    try:
        data = json.loads(source.read_text())
    except json.JSONDecodeError as exc:
        raise SynthError(f"outputs file {source} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    return StackOutputs(merge_stacks(data, source), source)


def default_outputs_path(cwd: Path | None = None) -> Path | None:
    """`cdk-outputs.json` in the working directory when it exists, so one command is enough."""
    candidate = (cwd or Path.cwd()) / DEFAULT_OUTPUTS_FILE
    return candidate if candidate.is_file() else None
