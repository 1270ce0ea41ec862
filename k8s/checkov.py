"""checkov skips as annotations on the object they excuse.

checkov reads `checkov.io/skip<N>: <check id>=<reason>` from an object's own metadata (a Job's,
not its pod template's), and prints the reason in every report. The reasons live next to what
they excuse; this module only spells them.
"""

from __future__ import annotations

from collections.abc import Sequence

ANNOTATION_PREFIX = "checkov.io/skip"
MIN_REASON_CHARS = 40


def annotations(findings: Sequence[tuple[str, str]]) -> dict[str, str] | None:
    """`(check id, reason)` pairs as annotations; None when there is nothing to skip."""
    seen: set[str] = set()
    for check, reason in findings:
        if check in seen:
            raise ValueError(f"checkov skip of {check} given twice: give it one reason")
        seen.add(check)
        if len(reason.strip()) < MIN_REASON_CHARS:
            raise ValueError(f"checkov skip of {check} needs a real reason, got {reason!r}")
        if "=" in reason:  # checkov splits the value at every '='
            raise ValueError(f"checkov skip reason of {check} may not contain '=': {reason!r}")
    return {f"{ANNOTATION_PREFIX}{i}": f"{check}={reason}" for i, (check, reason) in enumerate(findings, 1)} or None
