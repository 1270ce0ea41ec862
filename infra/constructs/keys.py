"""Customer-managed KMS keys: one per purpose, rotated yearly, deleted with their stack.

A key of its own per purpose keeps each key policy to the one service that needs it. A key costs
$1 a month; `cdk destroy` schedules it for deletion after the shortest waiting period, 7 days.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from constructs import Construct

PENDING_WINDOW_DAYS = 7


def rotating_key(scope: Construct, construct_id: str, description: str) -> kms.Key:
    """A symmetric key with automatic rotation; its default policy lets only IAM policies of
    this account grant use of it."""
    return kms.Key(
        scope,
        construct_id,
        description=description,
        enable_key_rotation=True,
        removal_policy=cdk.RemovalPolicy.DESTROY,
        pending_window=cdk.Duration.days(PENDING_WINDOW_DAYS),
    )
