"""Metadata helper shared by the charts: every object is named, namespaced and labelled explicitly."""

from __future__ import annotations

from collections.abc import Mapping

from cdk8s_plus_35 import k8s


def meta(
    name: str,
    labels: Mapping[str, str],
    namespace: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> k8s.ObjectMeta:
    return k8s.ObjectMeta(
        name=name, namespace=namespace, labels=dict(labels), annotations=dict(annotations) if annotations else None
    )
