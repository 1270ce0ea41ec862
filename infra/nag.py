"""cdk-nag acknowledgements, kept next to the resources they excuse.

cdk-nag 3.x reads CDK's native `Validations.of(scope).acknowledge(...)`; every finding id (e.g.
`AwsSolutions-IAM5[Resource::*]`) is acknowledged on its own, each with a reason.
"""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct


def acknowledge(scope: IConstruct, *findings: tuple[str, str]) -> None:
    """Acknowledge `(finding id, reason)` pairs on `scope` and everything below it."""
    cdk.Validations.of(scope).acknowledge(
        *(cdk.Acknowledgment(id=finding, reason=reason) for finding, reason in findings)
    )
