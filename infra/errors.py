"""Errors that stop `cdk synth` with a one-line message instead of a traceback."""


class DeploymentError(ValueError):
    """The profile is valid on its own but cannot be deployed as asked (e.g. an AZ the
    account does not have, or a VPC without a private subnet in the GPU AZ)."""
