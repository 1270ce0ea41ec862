"""Every synthesized manifest passes kubernetes-validate --strict, oldest creatable, default and newest schema."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from config.versions import DEFAULT_EKS_VERSION, EXTENDED_SUPPORT_ONLY

# The oldest version EKS still creates, the default, and the newest bundled schema.
VERSIONS = (f"{EXTENDED_SUPPORT_ONLY[0]}.0", f"{DEFAULT_EKS_VERSION}.0", latest_version())


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly(synthesis, version: str) -> None:
    failures = []
    for name, docs in synthesis.manifests.items():
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(str(p) for p in exc.absolute_path)
                failures.append(f"{name} {doc['kind']}/{doc['metadata']['name']} at {where}: {exc.message}")
    assert not failures, "\n".join(failures)


def test_newest_bundled_schema_is_checked() -> None:
    assert VERSIONS[-1] != VERSIONS[0]


def test_all_parts_are_synthesized(synthesis) -> None:
    kinds = sorted(d["kind"] for d in synthesis.docs())
    store = ["Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"] if synthesis.dep.external_store else []
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "DaemonSet", "Job", "ConfigMap", "Service", "Job", "Pod", "Pod", "Job"]
        + ["NetworkPolicy"] * 6 + store
    )


def test_no_persistent_volume_objects(synthesis) -> None:
    """The stack owns the FSx PV and PVC; manifests only mount the claim."""
    assert not {"PersistentVolume", "PersistentVolumeClaim", "Secret"} & {d["kind"] for d in synthesis.docs()}
