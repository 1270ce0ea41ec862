"""The trainer image repository."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_kms as kms
from constructs import Construct

from infra.constructs.keys import rotating_key


@dataclass(frozen=True)
class RegistryProps:
    repository_name: str


class Registry(Construct):
    """ECR repository: scan on push, immutable tags (a tag names one image forever, so a job
    restarted on a new node runs the same bits), images encrypted with a key of its own.
    `cdk destroy` deletes it with its images.

    ECR uses the key through a grant it creates with the repository, so pushing and pulling need
    no KMS permission of their own. A repository's encryption cannot change: a repository created
    with ECR's AES-256 is replaced, which CloudFormation refuses for a named one (delete the
    registry stack and push again)."""

    repository: ecr.Repository
    key: kms.Key

    def __init__(self, scope: Construct, construct_id: str, props: RegistryProps) -> None:
        super().__init__(scope, construct_id)
        self.key = rotating_key(self, "Key", f"ECR images of {props.repository_name}")
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=props.repository_name,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.KMS,
            encryption_key=self.key,
            removal_policy=cdk.RemovalPolicy.DESTROY,
            empty_on_delete=True,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    description="Keep the newest 50 images",
                    max_image_count=50,
                )
            ],
        )
