"""Fixtures for the wrapper: an outputs file, and a fake kubectl that records what it was asked.

No API server can run here, so real-mode tests put a small `kubectl` script first on PATH. It
appends each argv to a JSON-lines log and answers the few queries the wrapper makes.
"""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from config import load_profile

FAKE_KUBECTL = """\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_KUBECTL_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:2] == ["config", "view"]:
    print(os.environ.get("FAKE_KUBECONFIG", "{{}}"))
elif "get" in args and "jobs" in args and "json" in args:
    print(os.environ.get("FAKE_JOBS", '{{"items": []}}'))
elif "get" in args and "job" in args and any(a.startswith("jsonpath=") for a in args):
    print(os.environ.get("FAKE_JOB_CONDITIONS", " 1  Complete "), end="")
elif "get" in args and "pods" in args and any(a.startswith("jsonpath=") for a in args):
    print(os.environ.get("FAKE_POD", ""), end="")
elif "cp" in args and any(a.endswith(os.environ.get("FAKE_CP_MISSING", "/events")) for a in args):
    sys.exit(1)
elif "exec" in args:
    print("the view")
"""


def stack_outputs(profile_name: str) -> dict[str, dict[str, str]]:
    profile = load_profile(profile_name)
    return {
        "NvrxCluster": {
            "ClusterName": f"nvrx-{profile.name}",
            "KubeconfigCommand": f"aws eks update-kubeconfig --name nvrx-{profile.name} --region {profile.region}",
            "Region": profile.region,
            "Namespace": profile.namespace,
            "NodeLocalDir": "/mnt/k8s-disks/0",
        },
        "NvrxStorage": {"FsxPvcName": "fsx-claim", "FsxFileSystemId": "fs-0123456789abcdef0"},
        "NvrxRegistry": {"EcrRepositoryUri": f"123456789012.dkr.ecr.{profile.region}.amazonaws.com/nvrx-trainer"},
    }


def kubeconfig(context: str = "ctx", cluster: str = "arn:aws:eks:us-east-2:123456789012:cluster/nvrx-p5") -> str:
    return json.dumps({"current-context": context, "contexts": [{"name": context, "context": {"cluster": cluster}}]})


@dataclass
class FakeKubectl:
    bin_dir: Path
    log: Path

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def make_kubeconfig():
    return kubeconfig


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    path = tmp_path / "outputs-p5.json"  # not ./cdk-outputs.json, which would be found by default
    path.write_text(json.dumps(stack_outputs("p5")))
    return path


@pytest.fixture
def fake_kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKubectl:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl.py").write_text(textwrap.dedent(FAKE_KUBECTL.format()))
    # A shell script that runs it: a shebang cannot name an interpreter whose path has a space
    script = bin_dir / "kubectl"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} '
                      f'{shlex.quote(str(bin_dir / "kubectl.py"))} "$@"\n')
    script.chmod(0o755)
    log = tmp_path / "kubectl.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_KUBECTL_LOG", str(log))
    monkeypatch.setenv("FAKE_KUBECONFIG", kubeconfig())
    return FakeKubectl(bin_dir, log)
