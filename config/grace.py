"""SIGTERM to SIGKILL for a training pod: its terminationGracePeriodSeconds, and the trainer's
--termination_grace. On SIGTERM the ranks commit their newest state before SIGKILL
(`trainer.termination`), so the grace holds one checkpoint write on the profile's file
system with a margin, and the rest of a stop. The manifests (`k8s.deployment`) set it and the
capacity plan (`scripts.plan`) shows it; both read it here."""

from __future__ import annotations

import math

from config.contract import TERMINATION_GRACE_FLOOR_S
from config.fsx import FileSystem
from config.presets import PRESETS, STATE_BYTES_PER_PARAMETER, preset_parameters
from config.profile import Profile

GRACE_WRITE_FACTOR = 1.25  # FSx's throughput varies: the write must still end before SIGKILL
GRACE_STOP_S = 60  # the rest of a stop: the step in flight, the snapshot copy, commit, exit


def write_seconds(checkpoint_bytes: int, file_system: FileSystem) -> float:
    """One checkpoint's write at the file system's throughput."""
    return checkpoint_bytes / (file_system.write_mb_s * 1e6)


def termination_grace_seconds(write_s: float) -> int:
    """One checkpoint write of `write_s` with a margin, and the rest of a stop; at least the
    floor. A write already in flight at SIGTERM is committed in it; a newer one then only if it
    still fits (trainer.termination)."""
    return max(TERMINATION_GRACE_FLOOR_S, math.ceil(write_s * GRACE_WRITE_FACTOR + GRACE_STOP_S))


def profile_grace_seconds(profile: Profile) -> int:
    """The profile's grace. A model that is not a preset has no known size: the floor then."""
    model = profile.trainer.model
    if model not in PRESETS:
        return TERMINATION_GRACE_FLOOR_S
    checkpoint = preset_parameters(model) * STATE_BYTES_PER_PARAMETER
    return termination_grace_seconds(write_seconds(checkpoint, profile.storage.file_system))
