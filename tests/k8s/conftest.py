"""Shared fixtures: stack outputs per profile and one synthesis per (profile, mode), cached."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from config import MODE_NAMES, Profile, load_profile
from k8s import synth
from k8s.deployment import Deployment, resolve
from k8s.outputs import StackOutputs, merge_stacks

PROFILES = ("p5", "p4de", "g5-dev")


def stack_outputs(profile: Profile, **overrides: str) -> dict[str, dict[str, str]]:
    """What `cdk deploy --outputs-file` would write for this profile, split over stacks."""
    cluster = {
        "ClusterName": f"nvrx-{profile.name}",
        "KubeconfigCommand": f"aws eks update-kubeconfig --name nvrx-{profile.name} --region {profile.region}",
        "Region": profile.region,
        "Namespace": profile.namespace,
        "GpuNodeRoleArn": "arn:aws:iam::123456789012:role/nvrx-gpu",
        "NodeLocalDir": "/mnt/k8s-disks/0",
    }
    storage = {
        "FsxFileSystemId": "fs-0123456789abcdef0",
        "FsxDnsName": f"fs-0123456789abcdef0.fsx.{profile.region}.amazonaws.com",
        "FsxMountName": "abcdefgh",
        "FsxPvcName": "fsx-claim",
    }
    registry = {"EcrRepositoryUri": f"123456789012.dkr.ecr.{profile.region}.amazonaws.com/nvrx-trainer"}
    stacks = {"NvrxCluster": cluster, "NvrxStorage": storage, "NvrxRegistry": registry}
    for key, value in overrides.items():
        for outputs in stacks.values():
            if key in outputs:
                outputs[key] = value
    return stacks


def outputs_of(profile: Profile) -> StackOutputs:
    return StackOutputs(merge_stacks(stack_outputs(profile), Path("cdk-outputs.json")), Path("cdk-outputs.json"))


@dataclass(frozen=True)
class Synthesis:
    dep: Deployment
    manifests: dict[str, list[dict]]

    def docs(self) -> list[dict]:
        return [doc for docs in self.manifests.values() for doc in docs]

    def one(self, kind: str, component: str = "train") -> dict:
        found = [
            d
            for d in self.docs()
            if d["kind"] == kind and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} of {component}, got {len(found)}"
        return found[0]

    @property
    def job(self) -> dict:
        return self.one("Job")

    @property
    def pod_spec(self) -> dict:
        return self.job["spec"]["template"]["spec"]

    @property
    def trainer(self) -> dict:
        return self.pod_spec["containers"][0]

    @property
    def env(self) -> dict[str, dict]:
        return {e["name"]: e for e in self.trainer["env"]}

    def args_value(self, flag: str) -> str:
        args = self.trainer["args"]
        return args[args.index(flag) + 1]


def run_id_for(profile: str, mode: str) -> str:
    return f"{mode.replace('_', '-').replace('+', '-')}-{profile}-test"


@cache
def synthesized(profile: str, mode: str) -> Synthesis:
    """Synthesize once per (profile, mode) for the whole session."""
    prof = load_profile(profile)
    dep = resolve(prof, outputs_of(prof), mode=mode, run_id=run_id_for(profile, mode))
    return Synthesis(dep, synth.build(dep))


@pytest.fixture(params=[(p, m) for p in PROFILES for m in MODE_NAMES], ids=lambda pm: f"{pm[0]}-{pm[1]}")
def synthesis(request: pytest.FixtureRequest) -> Synthesis:
    return synthesized(*request.param)


@pytest.fixture
def synth_for():
    """The cached synthesis function, for tests that pick their own (profile, mode)."""
    return synthesized


@pytest.fixture
def outputs_file(tmp_path: Path):
    """Write an outputs file for a profile (with optional overrides) and return its path."""

    def write(profile: str = "p5", drop: tuple[str, ...] = (), **overrides: str) -> Path:
        stacks = stack_outputs(load_profile(profile), **overrides)
        for outputs in stacks.values():
            for key in drop:
                outputs.pop(key, None)
        path = tmp_path / f"outputs-{profile}.json"
        path.write_text(json.dumps(stacks))
        return path

    return write
