"""AWS CDK (Python) infrastructure for nvrx-eks: one profile in, three stacks out.

`infra.app` is the CDK entry point (`cdk synth -c profile=NAME`); `infra.stacks` composes the
constructs in `infra.constructs`, one construct per concern.
"""
