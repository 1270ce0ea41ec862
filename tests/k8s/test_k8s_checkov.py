"""checkov finds nothing unexplained in the manifests and the Dockerfile.

Every finding is fixed, or skipped on its object with the reason beside its cause (k8s.checkov);
a new finding fails here with checkov's own description of it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from config import MODE_NAMES, load_profile
from k8s import checkov, naming, synth
from k8s.deployment import resolve
from k8s.outputs import load_outputs
from tests.checkov import ROOT, describe, scan

pytestmark = pytest.mark.slow  # checkov over every manifest and the Dockerfile

DOCKERFILE = ROOT / "Dockerfile"
PROFILES = sorted(p.stem for p in (ROOT / "config" / "profiles").glob("*.yaml"))
WORKLOADS = ("job", "jobset")


def write_every_manifest(outdir: Path, outputs_file) -> set[str]:
    """The manifests of every profile, mode and workload, one directory each; returns the
    `Kind.namespace.name` of every Job and Pod among them."""
    workloads: set[str] = set()
    for name in PROFILES:
        outputs = load_outputs(outputs_file(name))
        for workload in WORKLOADS:
            profile = load_profile(name).model_copy(update={"workload": workload})
            for mode in MODE_NAMES:
                run_id = f"{naming.mode_slug(mode)}-{name}"
                manifests = synth.build(resolve(profile, outputs, mode=mode, run_id=run_id))
                synth.write(manifests, outdir / f"{run_id}-{workload}")
                workloads |= {
                    f"{doc['kind']}.{doc['metadata']['namespace']}.{doc['metadata']['name']}"
                    for docs in manifests.values()
                    for doc in docs
                    if doc["kind"] in ("Job", "Pod")
                }
    return workloads


def test_checkov_finds_nothing_in_the_manifests(tmp_path: Path, outputs_file) -> None:
    workloads = write_every_manifest(tmp_path / "manifests", outputs_file)
    result = scan("kubernetes", tmp_path / "manifests")
    assert not result.parsing_errors
    assert not result.failed, "checkov findings in the manifests:\n" + result.failures()
    assert workloads <= result.resources(), "checkov did not check every Job and Pod"
    assert all(r["check_result"].get("suppress_comment") for r in result.skipped)


def test_checkov_finds_nothing_in_the_dockerfile(tmp_path: Path) -> None:
    """The same scan also sees an image that breaks the rules, so an empty result means something."""
    probe = tmp_path / "Dockerfile"
    probe.write_text("FROM ubuntu\nRUN true\n")
    result = scan("dockerfile", DOCKERFILE, probe)

    def of(path: Path, records: list[dict]) -> list[dict]:
        return [r for r in records if Path(r["file_abs_path"]) == path]

    ours = of(DOCKERFILE, result.failed)
    assert not ours, "checkov findings in the Dockerfile:\n" + describe(ours)
    assert of(DOCKERFILE, result.passed)
    assert {r["check_id"] for r in of(probe, result.failed)} >= {"CKV_DOCKER_2", "CKV_DOCKER_7"}


def test_checkov_runs_without_a_network() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare (Linux) for a network namespace")
    result = scan("dockerfile", DOCKERFILE, prefix=("unshare", "--map-root-user", "--net"))
    assert result.passed and not result.failed


def test_skip_annotations_need_one_real_reason_each() -> None:
    reason = "A reason long enough to be one a reviewer could accept here."
    assert checkov.annotations([("CKV_K8S_8", reason), ("CKV_K8S_9", reason)]) == {
        "checkov.io/skip1": f"CKV_K8S_8={reason}",
        "checkov.io/skip2": f"CKV_K8S_9={reason}",
    }
    assert checkov.annotations([]) is None
    with pytest.raises(ValueError, match="real reason"):
        checkov.annotations([("CKV_K8S_8", "probes")])
    with pytest.raises(ValueError, match="may not contain '='"):
        checkov.annotations([("CKV_K8S_8", reason + " a=b")])
    with pytest.raises(ValueError, match="given twice"):
        checkov.annotations([("CKV_K8S_8", reason), ("CKV_K8S_8", reason)])
