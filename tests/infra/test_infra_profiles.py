"""Bad profiles stop `cdk synth` before synthesis with the profile's one-line error, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from config import ProfileError, profile_from_dict

ROOT = Path(__file__).resolve().parents[2]


def p5(**changes) -> dict:
    data = yaml.safe_load((ROOT / "config" / "profiles" / "p5.yaml").read_text())
    data["name"] = "bad"
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data


BAD_PROFILES = {
    "eks-no-longer-created": (
        p5(cluster__eks_version="1.30"),
        "eks_version '1.30' is past extended support: EKS no longer creates such clusters",
    ),
    "az-not-in-region": (
        p5(availability_zone="us-west-2a"),
        "availability_zone 'us-west-2a' is not in region 'us-east-2'",
    ),
    "bad-fsx-size": (
        p5(storage__fsx_capacity_gib=3000),
        "fsx_capacity_gib 3000 is not a valid FSx for Lustre SSD size",
    ),
    "unknown-fsx-deployment-type": (
        p5(storage__deployment_type="PERSISTENT_1"),
        "storage.deployment_type: Input should be 'SCRATCH_2' or 'PERSISTENT_2'",
    ),
    "persistent-2-without-a-tier": (
        p5(storage__deployment_type="PERSISTENT_2"),
        "storage: throughput_mb_s_per_tib is required with deployment_type PERSISTENT_2; "
        "use one of 125, 250, 500, 1000",
    ),
    "persistent-2-tier-unknown": (
        p5(storage__deployment_type="PERSISTENT_2", storage__throughput_mb_s_per_tib=200),
        "storage: throughput_mb_s_per_tib 200 is not a tier with deployment_type PERSISTENT_2; "
        "use one of 125, 250, 500, 1000",
    ),
    "scratch-2-with-a-tier": (
        p5(storage__throughput_mb_s_per_tib=250),
        "storage: throughput_mb_s_per_tib 250 needs deployment_type PERSISTENT_2 (tiers 125, 250, "
        "500, 1000); SCRATCH_2 has a fixed throughput",
    ),
    "persistent-2-with-an-import-path": (
        p5(storage__deployment_type="PERSISTENT_2", storage__throughput_mb_s_per_tib=250,
           storage__fsx_import_path="s3://bucket/data"),
        "storage: fsx_import_path needs deployment_type SCRATCH_2",
    ),
    "node-count-below-1": (
        p5(node_count=0),
        "node_count: Input should be greater than or equal to 1",
    ),
    "unknown-instance-type": (
        p5(instance_type="p9.96xlarge"),
        "unknown instance type 'p9.96xlarge'",
    ),
    "efa-count-mismatch": (
        p5(efa_interfaces=16),
        "efa_interfaces 16 disagrees with p5.48xlarge, which has 32",
    ),
}


def run_app(profile: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["CDK_CONTEXT_JSON"] = json.dumps({"profile": profile})
    env["CDK_OUTDIR"] = str(tmp_path / "cdk.out")
    env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = "20"
    return subprocess.run(
        [sys.executable, "-m", "infra.app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("rule", list(BAD_PROFILES))
def test_bad_profile_is_rejected_with_a_clear_message(rule, capsys, tmp_path):
    data, message = BAD_PROFILES[rule]
    with pytest.raises(ProfileError) as err:
        profile_from_dict(data)
    assert message in str(err.value) and "\n" not in str(err.value)

    # Through the CDK entry point: one line on stderr, exit status 2, nothing synthesized.
    from infra.app import main

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main({"profile": str(path)}, str(tmp_path / "cdk.out")) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: profile 'bad': ") and message in stderr
    assert stderr.count("\n") == 1
    assert not list((tmp_path / "cdk.out").glob("*.template.json"))


def test_cli_exit_status_and_no_traceback(tmp_path):
    data, message = BAD_PROFILES["bad-fsx-size"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    result = run_app(str(path), tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: profile 'bad': storage.fsx_capacity_gib: {message}; use 1200 or a multiple of 2400"
    ]


def test_unknown_profile_name_lists_the_available_ones(capsys, tmp_path):
    from infra.app import main

    assert main({"profile": "p6"}, str(tmp_path / "cdk.out")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: profile 'p6' not found; available: ") and "p5" in err
    assert err.count("\n") == 1


def test_az_the_account_does_not_have_stops_synthesis(capsys, tmp_path, cdk_context):
    # The region prefix matches, but the cached AZ lookup of us-east-2 has no us-east-2d.
    from infra.app import main

    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(p5(availability_zone="us-east-2d")))
    assert main(cdk_context | {"profile": str(path)}, str(tmp_path / "cdk.out")) == 2
    assert capsys.readouterr().err == (
        "error: availability zone us-east-2d does not exist in us-east-2 for this account "
        "(it has us-east-2a, us-east-2b, us-east-2c)\n"
    )


def test_second_az_the_account_does_not_have_stops_synthesis(capsys, tmp_path, cdk_context):
    from infra.app import main

    path = tmp_path / "d2.yaml"
    path.write_text(yaml.safe_dump(p5(cluster__second_availability_zone="us-east-2d")))
    assert main(cdk_context | {"profile": str(path)}, str(tmp_path / "cdk.out")) == 2
    assert capsys.readouterr().err == (
        "error: second availability zone us-east-2d does not exist in us-east-2 for this account "
        "(it has us-east-2a, us-east-2b, us-east-2c)\n"
    )


def test_existing_vpc_without_a_private_subnet_in_the_gpu_az_stops_synthesis(
    capsys, tmp_path, cdk_context, vpc_lookup
):
    from infra.app import main

    data = p5(cluster__vpc_id="vpc-0123456789abcdef0")
    path = tmp_path / "vpc.yaml"
    path.write_text(yaml.safe_dump(data))
    lookup = vpc_lookup(profile_from_dict(data), azs=["us-east-2a", "us-east-2b"])
    assert main(cdk_context | lookup | {"profile": str(path)}, str(tmp_path / "cdk.out")) == 2
    assert capsys.readouterr().err == (
        "error: VPC vpc-0123456789abcdef0 has no private subnet with egress in us-east-2c for "
        "the GPU nodes and FSx\n"
    )


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"storage__fsx_import_path": "my-bucket/data"},
            "fsx_import_path 'my-bucket/data' must be an s3://",
        ),
    ],
    ids=["import-path-not-s3"],
)
def test_undeployable_settings_stop_synthesis(changes, message, capsys, tmp_path, cdk_context):
    from infra.app import main

    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(p5(**changes)))
    assert main(cdk_context | {"profile": str(path)}, str(tmp_path / "cdk.out")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_profile_name_must_fit_aws_resource_names(capsys, tmp_path, cdk_context):
    from infra.app import main

    path = tmp_path / "P5_Big.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in p5().items() if k != "name"}))
    assert main(cdk_context | {"profile": str(path)}, str(tmp_path / "cdk.out")) == 2
    assert "profile name 'P5_Big' must be lowercase" in capsys.readouterr().err
