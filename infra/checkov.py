"""checkov skips, kept next to the resources they excuse, as cdk-nag acknowledgements are.

checkov reads `Metadata: {checkov: {skip: [{id, comment}]}}` of a CloudFormation resource; the
comment is the reason, printed in every report.
"""

from __future__ import annotations

import aws_cdk as cdk

from infra.nag import MIN_REASON_CHARS

METADATA_KEY = "checkov"


def skip(resource: cdk.CfnResource, *findings: tuple[str, str]) -> None:
    """Skip `(check id, reason)` pairs on one resource, after any skips it already has."""
    for check, reason in findings:
        if len(reason.strip()) < MIN_REASON_CHARS:
            raise ValueError(f"checkov skip of {check} needs a real reason, got {reason!r}")
    current = resource.get_metadata(METADATA_KEY) or {}
    entries = [*current.get("skip", []), *({"id": c, "comment": r} for c, r in findings)]
    resource.add_metadata(METADATA_KEY, {"skip": entries})
