"""The trainer image repository."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ecr as ecr
from constructs import Construct


@dataclass(frozen=True)
class RegistryProps:
    repository_name: str


class Registry(Construct):
    """ECR repository: scan on push, immutable tags (a tag names one image forever, so a job
    restarted on a new node runs the same bits). `cdk destroy` deletes it with its images."""

    repository: ecr.Repository

    def __init__(self, scope: Construct, construct_id: str, props: RegistryProps) -> None:
        super().__init__(scope, construct_id)
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=props.repository_name,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.AES_256,
            removal_policy=cdk.RemovalPolicy.DESTROY,
            empty_on_delete=True,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    description="Keep the newest 50 images",
                    max_image_count=50,
                )
            ],
        )
