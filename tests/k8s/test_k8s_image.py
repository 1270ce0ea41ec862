"""The trainer image reference: the commit by default, a tag or digest on request, never `latest`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from config import profile_from_dict
from k8s import image
from k8s.cli import main as synth_main
from k8s.deployment import resolve
from k8s.errors import SynthError
from k8s.outputs import load_outputs

REPO = Path(__file__).resolve().parents[2]
ECR = "123456789012.dkr.ecr.us-east-2.amazonaws.com/nvrx-trainer"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def p5_with(**fields: object):
    return profile_from_dict(yaml.safe_load((REPO / "config/profiles/p5.yaml").read_text()) | {"name": "p5", **fields})


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_commit_tag_is_the_checkouts_commit(tmp_path: Path) -> None:
    git(tmp_path, "init", "--quiet")
    (tmp_path / "f").write_text("x")
    git(tmp_path, "add", "f")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "-m", "x")
    tag = image.commit_tag(tmp_path)
    assert len(tag) == image.COMMIT_TAG_LENGTH and git(tmp_path, "rev-parse", "HEAD").startswith(tag)


def test_no_commit_is_one_line_naming_the_ways_out(tmp_path: Path) -> None:
    with pytest.raises(SynthError) as err:
        image.commit_tag(tmp_path)
    message = str(err.value)
    assert "\n" not in message and "no git commit" in message and "--image_tag" in message


@pytest.mark.parametrize(
    ("fields", "reference", "policy"),
    [
        ({}, None, "IfNotPresent"),  # the commit, in the stack's repository
        ({"image_tag": "nvrx-0.4.1"}, f"{ECR}:nvrx-0.4.1", "IfNotPresent"),
        ({"image": f"{ECR}:v2"}, f"{ECR}:v2", "IfNotPresent"),  # the stack's repository, named in full
        ({"image": "registry:5000/nvrx-trainer:v2"}, "registry:5000/nvrx-trainer:v2", "Always"),
        ({"image": f"nvrx-trainer@{DIGEST}"}, f"nvrx-trainer@{DIGEST}", "IfNotPresent"),
        ({"image": f"registry:5000/nvrx-trainer:latest@{DIGEST}"}, None, "IfNotPresent"),
    ],
)
def test_pull_policy_follows_what_can_move(outputs_file, fields, reference, policy) -> None:
    dep = resolve(p5_with(**fields), load_outputs(outputs_file("p5")), run_id="r1")
    assert dep.image.reference == (reference or dep.image.reference)
    assert dep.image.pull_policy == policy


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"image_tag": "latest"}, "image tag 'latest' moves with every push"),
        ({"image_tag": "-x"}, "image tag '-x' is not a tag"),
        ({"image": f"{ECR}:latest"}, "image tag 'latest' moves with every push"),
        ({"image": "registry:5000/nvrx-trainer"}, "image 'registry:5000/nvrx-trainer' names no tag"),
        ({"image": "nvrx-trainer@sha256:abc"}, "the digest must be 'sha256:' and 64"),
    ],
)
def test_a_reference_that_can_move_is_refused(outputs_file, fields, message) -> None:
    with pytest.raises(SynthError, match=message):
        resolve(p5_with(**fields), load_outputs(outputs_file("p5")), run_id="r1")


def test_cli_refuses_latest_with_one_line_and_exit_2(outputs_file, tmp_path: Path, capsys) -> None:
    args = ["synth", "--profile", "p5", "--outputs", str(outputs_file("p5")), "--image_tag", "latest",
            "--outdir", str(tmp_path / "out")]
    assert synth_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "image tag 'latest'" in err
    assert not (tmp_path / "out").exists()


def test_only_tags_of_the_stack_repository_are_excused_from_digests() -> None:
    in_stack = image.TrainerImage(f"{ECR}:abc", in_stack_repository=True)
    assert {check for check, _ in image.checkov_skips(in_stack)} == {"CKV_K8S_43", "CKV_K8S_15"}
    assert image.checkov_skips(image.TrainerImage("other/trainer:abc", in_stack_repository=False)) == []
    assert image.checkov_skips(image.TrainerImage(f"{ECR}@{DIGEST}", in_stack_repository=True)) == []
