"""CDK entry point: `cdk synth -c profile=NAME` (default from cdk.json: p5).

A bad profile stops here with its one-line ProfileError and exit status 2, before any synthesis;
so does a profile this account cannot host (DeploymentError, e.g. an AZ it does not have).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402

from config import Profile, ProfileError, load_profile  # noqa: E402
from infra.errors import DeploymentError  # noqa: E402
from infra.stacks import ClusterStack, GpuStack, NetworkStack, RegistryStack, stack_names  # noqa: E402

DEFAULT_PROFILE = "p5"


def resolve_account(app: cdk.App) -> str | None:
    """Explicit `-c account=...`, else the CLI's credentials, else the offline example account.

    The example account only serves offline synthesis (its AZ lookups are in cdk.context.json);
    a deploy with it fails for want of credentials, which is the safe failure.
    """
    return (
        app.node.try_get_context("account")
        or os.environ.get("CDK_DEFAULT_ACCOUNT")
        or app.node.try_get_context("nvrx-eks:offline-account")
    )


def build(app: cdk.App, profile: Profile) -> dict[str, cdk.Stack]:
    """Add the profile's four stacks to `app`."""
    env = cdk.Environment(account=resolve_account(app), region=profile.region)
    names = stack_names(profile)
    network = NetworkStack(
        app,
        names["network"],
        profile=profile,
        env=env,
        description=f"nvrx-eks {profile.name}: VPC, flow logs, GPU subnet in {profile.availability_zone}",
    )
    registry = RegistryStack(
        app,
        names["registry"],
        profile=profile,
        env=env,
        description=f"nvrx-eks {profile.name}: trainer image repository",
    )
    cluster = ClusterStack(
        app,
        names["cluster"],
        profile=profile,
        network=network.network,
        env=env,
        description=f"nvrx-eks {profile.name}: EKS, system nodes, FSx for Lustre",
    )
    cluster.add_stack_dependency(network)
    gpu = GpuStack(
        app,
        names["gpu"],
        profile=profile,
        network=network.network,
        cluster=cluster,
        env=env,
        description=(
            f"nvrx-eks {profile.name}: {profile.node_count}x {profile.instance_type} in "
            f"{profile.availability_zone}"
        ),
    )
    stacks = {"network": network, "registry": registry, "cluster": cluster, "gpu": gpu}
    for stack in stacks.values():
        cdk.Tags.of(stack).add("project", "nvrx-eks")
        cdk.Tags.of(stack).add("nvrx-eks:profile", profile.name)
    return stacks


def add_nag(app: cdk.App) -> None:
    """cdk-nag's AwsSolutions pack as a CDK validation plugin (`cdk synth -c nag=true`)."""
    from cdk_nag import AwsSolutionsChecks  # a dev dependency: imported only when asked for

    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def main(context: dict | None = None, outdir: str | None = None) -> int:
    """Run by the cdk CLI (context from its environment); tests pass `context` and `outdir`."""
    app = cdk.App(context=context, outdir=outdir)
    name = str(app.node.try_get_context("profile") or DEFAULT_PROFILE)
    try:
        profile = load_profile(name)
        build(app, profile)
    except (ProfileError, DeploymentError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if str(app.node.try_get_context("nag")).lower() == "true":
        add_nag(app)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
