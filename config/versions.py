"""Kubernetes versions EKS will create in late 2026, the kubectl layer the stacks bundle, and the
NVRx releases a trainer image may be built with.

EKS gives each minor version 14 months of standard support, then 12 of extended support
(billed extra), after which it no longer creates clusters of that version. Checked November
2026: 1.33 left standard support in July 2026; 1.28-1.31 are past extended support.
"""

from __future__ import annotations

import re

# Versions in standard support, oldest first; the newest one aws_eks_v2 (aws-cdk-lib 2.275) knows.
STANDARD_SUPPORT = ("1.34", "1.35", "1.36")
# Versions EKS still creates, but only under extended support.
EXTENDED_SUPPORT_ONLY = ("1.32", "1.33")
DEFAULT_EKS_VERSION = "1.35"
# The kubectl/helm Lambda layer bundled with the app (aws-cdk.lambda-layer-kubectl-v35);
# kubectl supports one minor version of skew either way, so it serves 1.34-1.36.
KUBECTL_LAYER_MINOR = 35


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def check_eks_version(version: str, extended: bool = True) -> str | None:
    """The version if EKS creates it (with `extended=False`: under standard support), else
    raise ValueError naming what is allowed; None when only extended support would take it."""
    if not re.fullmatch(r"1\.\d+", version):
        raise ValueError(f"eks_version {version!r} must look like \"{DEFAULT_EKS_VERSION}\"")
    allowed = f"use one of {', '.join(EXTENDED_SUPPORT_ONLY + STANDARD_SUPPORT)}"
    if _minor(version) < _minor(EXTENDED_SUPPORT_ONLY[0]):
        raise ValueError(
            f"eks_version {version!r} is past extended support: EKS no longer creates such clusters; "
            f"{allowed}"
        )
    if _minor(version) > _minor(STANDARD_SUPPORT[-1]):
        raise ValueError(f"eks_version {version!r} is newer than this app supports; {allowed}")
    if version in EXTENDED_SUPPORT_ONLY and not extended:
        return None
    return version


def kubectl_skew(version: str) -> int:
    """Minor versions between the cluster and the bundled kubectl layer."""
    return abs(_minor(version) - KUBECTL_LAYER_MINOR)


# The NVRx releases the trainer runs on (pyproject's range): 0.4.1 (the published benchmark, the
# CPU machines) through 0.7.x (the image's default). How the trainer bridges them is in
# trainer.nvrx_compat; what synthesis must know of the image's release is here.
NVRX_OLDEST = (0, 4, 1)
NVRX_NEWEST_MINOR = (0, 7)
DEFAULT_NVRX_VERSION = "0.7.0"
# From 0.6 ft_launcher's rendezvous is a barrier rendezvous: its world is fixed (spares wait, a
# world never shrinks), only the store's host closes a round, and it keeps no keep-alive.
NVRX_BARRIER_RENDEZVOUS_FROM = (0, 6)


def nvrx_release(version: str) -> tuple[int, ...]:
    """`version` ("0.7.0") as a tuple, if the trainer runs on it; else raise ValueError naming
    what is allowed."""
    allowed = (f"allowed: {'.'.join(map(str, NVRX_OLDEST))} through "
               f"{'.'.join(map(str, NVRX_NEWEST_MINOR))}.x, e.g. {DEFAULT_NVRX_VERSION}")
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ValueError(f"nvrx_version {version!r} must be a release like {DEFAULT_NVRX_VERSION}")
    release = tuple(int(x) for x in version.split("."))
    if release < NVRX_OLDEST or release[:2] > NVRX_NEWEST_MINOR:
        raise ValueError(f"nvrx_version {version!r} is not one the trainer runs on; {allowed}")
    return release


def nvrx_shrinks_world(release: tuple[int, ...]) -> bool:
    """Whether ft_launcher of NVRx `release` trains on with fewer nodes than it started with."""
    return release[:2] < NVRX_BARRIER_RENDEZVOUS_FROM
