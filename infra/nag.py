"""cdk-nag acknowledgements, kept next to the resources they excuse.

cdk-nag 3.x reads CDK's native `Validations.of(scope).acknowledge(...)`; every finding id (e.g.
`AwsSolutions-IAM5[Resource::*]`) is acknowledged on its own, each with a reason.
"""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct

MIN_REASON_CHARS = 40


def acknowledge(scope: IConstruct, *findings: tuple[str, str]) -> None:
    """Acknowledge `(finding id, reason)` pairs on `scope` and everything below it.

    A reason must say why the finding does not apply here; a one-word excuse is refused.
    """
    for finding, reason in findings:
        if len(reason.strip()) < MIN_REASON_CHARS:
            raise ValueError(f"acknowledgement of {finding} needs a real reason, got {reason!r}")
    cdk.Validations.of(scope).acknowledge(
        *(cdk.Acknowledgment(id=finding, reason=reason) for finding, reason in findings)
    )
