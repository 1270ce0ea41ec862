"""Profile files: YAML and schema problems are one line naming file, line or key; exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config import ProfileError, load_profile, profile_from_dict
from config.versions import DEFAULT_EKS_VERSION

ROOT = Path(__file__).resolve().parents[2]
P5 = (ROOT / "config" / "profiles" / "p5.yaml").read_text()


def write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    message = str(err.value)
    assert "\n" not in message
    return message


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, P5.replace("node_count: 2", "node_count: [2"))
    message = error_of(path)
    assert message.startswith(f"{path}:") and "YAML syntax error" in message
    line = int(message.split(":")[1])
    assert P5.splitlines()[line - 1].startswith(("node_count", "placement_group"))


def test_yaml_syntax_error_through_the_cdk_app_is_one_line_exit_2(tmp_path):
    path = write(tmp_path, P5 + "trainer: : :\n")
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys; from infra.app import main; sys.exit(main({{'profile': {str(path)!r}}}, {str(tmp_path / 'out')!r}))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:")


def test_unknown_key_gets_a_suggestion_instead_of_a_missing_field(tmp_path):
    message = error_of(write(tmp_path, P5.replace("node_count:", "node_cont:")))
    assert message == "profile 'bad': node_cont: unknown key; did you mean 'node_count'?"


def test_unknown_nested_key_gets_a_suggestion(tmp_path):
    message = error_of(write(tmp_path, P5.replace("  max_steps:", "  max_step:")))
    assert message == "profile 'bad': trainer.max_step: unknown key; did you mean 'max_steps'?"


def test_duplicate_keys_are_refused_with_both_lines(tmp_path):
    message = error_of(write(tmp_path, P5 + "node_count: 4\n"))
    first = next(i for i, line in enumerate(P5.splitlines(), 1) if line.startswith("node_count:"))
    assert message.endswith(f"key 'node_count' appears twice (first on line {first})")
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:{len(P5.splitlines()) + 1}:")


def test_unquoted_version_gets_a_hint(tmp_path):
    message = error_of(write(tmp_path, P5.replace('eks_version: "1.35"', "eks_version: 1.30")))
    assert "eks_version 1.3 must be a quoted string" in message and "YAML reads 1.30 as the number 1.3" in message


def test_number_for_a_string_field_gets_a_quote_hint(tmp_path):
    message = error_of(write(tmp_path, P5.replace("namespace: nvrx", "namespace: 2026")))
    assert message.startswith("profile 'bad': namespace: Input should be a valid string")
    assert 'quote it in YAML ("2026" is read as a number)' in message


def raw(**cluster) -> dict:
    import yaml

    data = yaml.safe_load(P5)
    data["name"] = "bad"
    data["cluster"].update(cluster)
    return data


@pytest.mark.parametrize(
    "cluster, message",
    [
        ({"eks_version": "1.33"}, "eks_version '1.33' is past standard support"),
        ({"eks_version": "1.40"}, "eks_version '1.40' is newer than this app supports"),
        ({"eks_version": "1.29"}, "EKS no longer creates such clusters"),
        ({"endpoint_access": "public_and_private"}, "endpoint_access 'public_and_private' needs public_access_cidrs"),
        ({"endpoint_access": "public"}, "cluster.endpoint_access: Input should be 'private' or 'public_and_private'"),
        ({"public_access_cidrs": ["everywhere"]}, "public_access_cidrs entry 'everywhere' is not an IPv4 CIDR"),
        ({"gpu_ami": "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/recommended/image_id"},
         "follows the newest release on every deploy"),
        ({"gpu_ami": "/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/x86_64/nvidia/r/image_id"},
         "is not an image for eks_version 1.35"),
        ({"gpu_ami": "latest"}, "gpu_ami 'latest' must be an AMI id"),
        ({"second_availability_zone": "us-east-2c"}, "must be another AZ of region 'us-east-2' than 'us-east-2c'"),
        ({"second_availability_zone": "us-west-2a"}, "second_availability_zone 'us-west-2a' must be another AZ"),
        ({"second_availability_zone": None}, "cluster.second_availability_zone is required for a new VPC"),
    ],
    ids=["past-standard", "too-new", "not-created", "public-without-cidrs", "public-only", "bad-cidr", "recommended-ami",
         "ami-of-another-version", "ami-garbage", "same-az", "az-other-region", "no-second-az"],
)  # fmt: skip
def test_cluster_settings_are_checked(cluster, message):
    with pytest.raises(ProfileError) as err:
        profile_from_dict(raw(**cluster))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_extended_support_is_an_explicit_choice():
    ami = "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/nvidia/rel/image_id"
    profile = profile_from_dict(raw(eks_version="1.33", support_type="EXTENDED", gpu_ami=ami))
    assert profile.cluster.support_type == "EXTENDED"


def test_capacity_reservation_combines_with_the_placement_group():
    data = raw()
    data["capacity_reservation"] = {"id": "cr-0123456789abcdef0"}
    profile = profile_from_dict(data)
    assert profile.placement_group and profile.capacity_reservation is not None


def test_shipped_profiles_use_the_default_version():
    for name in ("p5", "p4de", "g5-dev"):
        assert load_profile(name).cluster.eks_version == DEFAULT_EKS_VERSION


@pytest.mark.parametrize("section, fragment", [
    ("observability:\n  monitoring_namespace: Prom_NS\n",
     "observability.monitoring_namespace: monitoring_namespace 'Prom_NS' is not a valid "
     "Kubernetes name"),
    ("observability:\n  cloudwatch: sometimes\n", "observability.cloudwatch: Input should be a valid boolean"),
    ("observability:\n  grafana: true\n",
     "observability.grafana: unknown key; known keys: monitoring_namespace, pod_monitor, cloudwatch"),
])
def test_observability_settings_are_checked(tmp_path, section, fragment):
    assert fragment in error_of(write(tmp_path, P5 + section))
