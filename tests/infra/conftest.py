"""Synthesize each profile once per session; every test reads the same cloud assembly.

Synthesis takes 5-10 s per profile on two cores, so the fixtures are session-scoped and cached
by variant name. cdk-nag runs as a CDK validation plugin during that one synthesis.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

from config import Profile, load_profile, profile_from_dict  # noqa: E402

OFFLINE_ACCOUNT = "123456789012"
EXISTING_VPC_ID = "vpc-0123456789abcdef0"


def app_context() -> dict[str, Any]:
    """What `cdk synth` would see: cdk.json context, cdk.context.json, the offline account."""
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    context.update(json.loads((ROOT / "cdk.context.json").read_text()))
    context["account"] = OFFLINE_ACCOUNT  # ignore CDK_DEFAULT_ACCOUNT of whoever runs the tests
    return context


def raw_profile(name: str) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "config" / "profiles" / f"{name}.yaml").read_text())
    data["name"] = name
    return data


def existing_vpc_lookup(profile: Profile, azs: list[str] | None = None) -> dict[str, Any]:
    """A cached `ec2.Vpc.from_lookup` answer, as `cdk synth` would store it after a lookup:
    a private and a public subnet in another AZ and in the profile's AZ (or in `azs`)."""
    key = (
        f"vpc-provider:account={OFFLINE_ACCOUNT}:filter.vpc-id={EXISTING_VPC_ID}:"
        f"region={profile.region}:returnAsymmetricSubnets=true"
    )
    other = f"{profile.region}{'b' if profile.availability_zone.endswith('a') else 'a'}"
    azs = azs or [other, profile.availability_zone]

    def subnets(kind: str, base: int) -> list[dict[str, str]]:
        return [
            {
                "subnetId": f"subnet-{kind}{i:013x}",
                "cidr": f"10.9.{base + i * 32}.0/19",
                "availabilityZone": az,
                "routeTableId": f"rtb-{kind}{i:013x}",
            }
            for i, az in enumerate(azs)
        ]

    return {
        key: {
            "vpcId": EXISTING_VPC_ID,
            "vpcCidrBlock": "10.9.0.0/16",
            "ownerAccountId": OFFLINE_ACCOUNT,
            "availabilityZones": [],
            "subnetGroups": [
                {"name": "Private", "type": "Private", "subnets": subnets("0ace", 0)},
                {"name": "Public", "type": "Public", "subnets": subnets("0bee", 128)},
            ],
        }
    }


@dataclass
class Synth:
    """One synthesized app: its profile, templates by stack role, and the cdk-nag findings."""

    profile: Profile
    outdir: Path
    templates: dict[str, dict[str, Any]]
    violations: list[tuple[str, str, str]]  # (plugin, rule, construct path), unacknowledged
    messages: list[tuple[str, str]] = field(default_factory=list)

    def template(self, role: str) -> Template:
        return Template.from_json(self.templates[role])

    def resources(self, role: str, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.templates[role]["Resources"].items() if v["Type"] == type_}

    def all_resources(self, type_: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for role in self.templates:
            out.update(self.resources(role, type_))
        return out

    def one(self, role: str, type_: str) -> tuple[str, dict[str, Any]]:
        found = self.resources(role, type_)
        assert len(found) == 1, f"expected one {type_} in {role}, found {list(found)}"
        return next(iter(found.items()))


def synthesize(
    profile: Profile, outdir: Path, extra_context: dict[str, Any] | None = None
) -> Synth:
    from cdk_nag import AwsSolutionsChecks

    from infra.app import build
    from infra.stacks import stack_names

    app = cdk.App(context=app_context() | (extra_context or {}), outdir=str(outdir))
    build(app, profile)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    try:
        assembly = app.synth()
    except RuntimeError as exc:  # cdk-nag findings fail validation; the report says which
        if "ValidationFailed" not in str(exc):
            raise
        assembly = cdk.cx_api.CloudAssembly(str(outdir))
    names = stack_names(profile)
    templates = {
        role: json.loads((outdir / f"{name}.template.json").read_text())
        for role, name in names.items()
    }
    violations: list[tuple[str, str, str]] = []
    report = outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text()).get("pluginReports", []):
            for violation in plugin.get("violations", []):
                for construct in violation["violatingConstructs"]:
                    violations.append(
                        (plugin["pluginName"], violation["ruleName"], construct["constructPath"])
                    )
    messages = [
        (str(m.level), str(m.entry.data)) for stack in assembly.stacks for m in stack.messages
    ]
    return Synth(profile, outdir, templates, violations, messages)


VARIANTS: dict[str, Callable[[], tuple[Profile, dict[str, Any]]]] = {
    "p5": lambda: (load_profile("p5"), {}),
    "p4de": lambda: (load_profile("p4de"), {}),
    "g5-dev": lambda: (load_profile("g5-dev"), {}),
    # A Capacity Block inside the cluster placement group.
    "p5-capacity-block": lambda: (
        profile_from_dict(
            raw_profile("p5")
            | {
                "name": "p5cb",
                "placement_group": True,
                "capacity_reservation": {"id": "cr-0123456789abcdef0", "capacity_block": True},
            }
        ),
        {},
    ),
    # One hot spare and a capacity reservation the stack creates for the whole group.
    "p5-spares": lambda: (
        profile_from_dict(
            raw_profile("p5")
            | {"name": "p5spare", "spare_nodes": 1, "capacity_reservation": {}}
        ),
        {},
    ),
    # The JobSet workload and the CloudWatch add-on, with a public endpoint limited to one network.
    "p4de-jobset": lambda: (
        profile_from_dict(
            raw_profile("p4de")
            | {
                "name": "p4dejs",
                "workload": "jobset",
                "observability": {"cloudwatch": True},
                "cluster": dict(
                    raw_profile("p4de")["cluster"],
                    endpoint_access="public_and_private",
                    public_access_cidrs=["203.0.113.0/24"],
                ),
            }
        ),
        {},
    ),
    # The GPU image pinned by AMI id instead of an SSM parameter.
    "g5-ami-id": lambda: (
        profile_from_dict(
            raw_profile("g5-dev")
            | {
                "name": "g5ami",
                "cluster": dict(raw_profile("g5-dev")["cluster"], gpu_ami="ami-0123456789abcdef0"),
            }
        ),
        {},
    ),
    # An existing VPC by id, with its lookup answer cached as after a first `cdk synth`.
    "p4de-existing-vpc": lambda: _existing_vpc_variant(),
    # The storage `nvrx-eks plan` recommends when SCRATCH_2 cannot keep up.
    "p5-persistent": lambda: (
        profile_from_dict(
            raw_profile("p5")
            | {
                "name": "p5p2",
                "storage": {
                    "deployment_type": "PERSISTENT_2",
                    "throughput_mb_s_per_tib": 500,
                    "fsx_capacity_gib": 4800,
                },
            }
        ),
        {},
    ),
}


def _existing_vpc_variant() -> tuple[Profile, dict[str, Any]]:
    data = raw_profile("p4de")
    data["name"] = "p4devpc"
    data["cluster"] = dict(data.get("cluster") or {}, vpc_id=EXISTING_VPC_ID)
    profile = profile_from_dict(data)
    return profile, existing_vpc_lookup(profile)


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Synth]:
    cache: dict[str, Synth] = {}

    def get(variant: str) -> Synth:
        if variant not in cache:
            profile, context = VARIANTS[variant]()
            cache[variant] = synthesize(profile, tmp_path_factory.mktemp(variant), context)
        return cache[variant]

    return get


@pytest.fixture(scope="session")
def variant_names() -> list[str]:
    """Every shape of the stacks the suite synthesizes."""
    return list(VARIANTS)


@pytest.fixture(scope="session")
def cdk_context() -> dict[str, Any]:
    return app_context()


@pytest.fixture(scope="session")
def vpc_lookup() -> Callable[..., dict[str, Any]]:
    return existing_vpc_lookup
