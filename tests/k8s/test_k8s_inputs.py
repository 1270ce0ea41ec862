"""Inputs: outputs-file merging, required values, consistency checks, run ids, and the CLI errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from config import ProfileError, load_profile, profile_from_dict
from k8s import naming
from k8s.cli import main as synth_main
from k8s.deployment import resolve
from k8s.errors import SynthError
from k8s.outputs import StackOutputs, load_outputs, merge_stacks

REPO = Path(__file__).resolve().parents[2]


def test_stacks_are_merged_and_conflicts_named() -> None:
    merged = merge_stacks({"A": {"Region": "us-east-2", "X": "1"}, "B": {"Region": "us-east-2"}}, Path("o.json"))
    assert merged == {"Region": "us-east-2", "X": "1"}
    with pytest.raises(SynthError, match="'Region' is 'us-east-2' in stack 'A' but 'eu-west-1' in stack 'B'"):
        merge_stacks({"A": {"Region": "us-east-2"}, "B": {"Region": "eu-west-1"}}, Path("o.json"))


def test_bad_outputs_files(tmp_path: Path) -> None:
    with pytest.raises(SynthError, match="not found"):
        load_outputs(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(SynthError, match="not valid JSON"):
        load_outputs(broken)
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"Stack": "value"}))
    with pytest.raises(SynthError, match="stack 'Stack' must map"):
        load_outputs(flat)


def test_no_outputs_and_no_image_names_the_key() -> None:
    with pytest.raises(SynthError, match="missing required value 'EcrRepositoryUri'.*no outputs file"):
        resolve(load_profile("p5"), StackOutputs(), run_id="r1")


def test_profile_image_still_needs_the_fsx_claim() -> None:
    data = yaml.safe_load((REPO / "config/profiles/p5.yaml").read_text()) | {"name": "p5", "image": "my/image:1"}
    with pytest.raises(SynthError, match="missing required value 'FsxPvcName'"):
        resolve(profile_from_dict(data), StackOutputs(), run_id="r1")


def test_profile_image_wins_over_the_repository(outputs_file) -> None:
    data = yaml.safe_load((REPO / "config/profiles/p5.yaml").read_text()) | {"name": "p5", "image": "my/image:1"}
    dep = resolve(profile_from_dict(data), load_outputs(outputs_file("p5")), run_id="r1")
    assert dep.image.reference == "my/image:1"


def test_image_defaults_to_repository_at_the_commit(outputs_file) -> None:
    dep = resolve(load_profile("p5"), load_outputs(outputs_file("p5")), run_id="r1")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    repository, tag = dep.image.reference.split(":")
    assert repository == "123456789012.dkr.ecr.us-east-2.amazonaws.com/nvrx-trainer"
    assert len(tag) == 12 and commit.startswith(tag)
    assert dep.namespace_owned_by_stack


@pytest.mark.parametrize("key", ["Namespace", "Region"])
def test_outputs_of_another_deployment_are_rejected(outputs_file, key: str) -> None:
    path = outputs_file("p5", **{key: "other"})
    with pytest.raises(SynthError, match=f"{key} 'other' .* disagrees with profile 'p5'"):
        resolve(load_profile("p5"), load_outputs(path), run_id="r1")


def test_nvme_node_dir_needs_node_local_dir_and_mounts_it(outputs_file) -> None:
    data = yaml.safe_load((REPO / "config/profiles/p5.yaml").read_text()) | {"name": "p5"}
    data["tiers"] = {"node_dir": "nvme"}
    profile = profile_from_dict(data)
    with pytest.raises(SynthError, match="missing required value 'NodeLocalDir'"):
        resolve(profile, load_outputs(outputs_file("p5", drop=("NodeLocalDir",))), run_id="r1")

    from k8s import synth

    dep = resolve(profile, load_outputs(outputs_file("p5")), run_id="nvme-run")
    job = next(d for d in synth.build(dep, [synth.TRAIN])["30-train-nvme-run.yaml"] if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    host = {v["name"]: v for v in pod["volumes"]}["node-local"]["hostPath"]
    assert host == {"path": "/mnt/k8s-disks/0/nvrx-runs/nvme-run", "type": "DirectoryOrCreate"}
    trainer = pod["containers"][0]
    assert trainer["args"][trainer["args"].index("--node_dir") + 1] == "/mnt/node-local"
    assert {"name": "node-local", "mountPath": "/mnt/node-local"} in trainer["volumeMounts"]


def test_in_process_modes_need_nccl_timeout_below_hard_timeout(outputs_file) -> None:
    data = yaml.safe_load((REPO / "config/profiles/p5.yaml").read_text()) | {"name": "p5"}
    data["trainer"] |= {"nccl_timeout": 120, "soft_timeout": 60, "hard_timeout": 90}
    profile = profile_from_dict(data)
    out = load_outputs(outputs_file("p5"))
    with pytest.raises(SynthError, match="trainer.nccl_timeout 120 must be below trainer.hard_timeout 90"):
        resolve(profile, out, mode="inprocess", run_id="r1")
    assert resolve(profile, out, mode="ft_launcher", run_id="r1").mode == "ft_launcher"


def test_shm_must_fit_in_the_pod_memory(outputs_file) -> None:
    from k8s import synth

    data = yaml.safe_load((REPO / "config/profiles/g5-dev.yaml").read_text()) | {"name": "g5-dev"}
    data["tiers"] = {"shm_size_gib": 200}
    dep = resolve(profile_from_dict(data), load_outputs(outputs_file("g5-dev")), run_id="r1")
    with pytest.raises(SynthError, match=r"/dev/shm of \d+ GiB .*tiers.shm_size_gib 200"):
        synth.build(dep, [synth.TRAIN])


def test_default_run_id_is_mode_and_time_and_runs_differ() -> None:
    t = datetime(2026, 11, 29, 17, 37, 0, tzinfo=UTC)
    assert naming.default_run_id("ft_launcher+inprocess", t) == "ft-launcher-inprocess-20261129-173700"
    assert naming.default_run_id("baseline", t) != naming.default_run_id("inprocess", t)


@pytest.mark.parametrize("bad", ["Upper", "-x", "x-", "a_b", "x" * 60])
def test_invalid_run_ids(bad: str) -> None:
    with pytest.raises(SynthError, match="run id"):
        naming.validate_run_id(bad, node_count=16)


def test_run_directories_never_overlap(outputs_file) -> None:
    out = load_outputs(outputs_file("p5"))
    a = resolve(load_profile("p5"), out, mode="baseline")
    b = resolve(load_profile("p5"), out, mode="ft_launcher")
    assert a.run_dir != b.run_dir and not b.run_dir.startswith(a.run_dir + "/")


def test_cli_writes_files(outputs_file, tmp_path: Path, capsys) -> None:
    code = synth_main(["synth", "--profile", "p4de", "--mode", "baseline", "--outputs", str(outputs_file("p4de")),
                       "--run_id", "cli-run", "--outdir", str(tmp_path / "dist")])  # fmt: skip
    assert code == 0
    names = sorted(p.name for p in (tmp_path / "dist").iterdir())
    assert names == ["00-namespace.yaml", "10-common.yaml", "20-data-prep.yaml", "30-train-cli-run.yaml",
                     "40-results-cli-run.yaml", "45-watch-cli-run.yaml", "50-export-cli-run.yaml"]  # fmt: skip
    assert "run cli-run (baseline, 2x p4de.24xlarge)" in capsys.readouterr().out


def test_cli_missing_value_is_one_line_and_exit_2(tmp_path: Path, monkeypatch) -> None:
    """`python -m k8s synth` with no outputs file and no image: one line naming the key, exit 2."""
    monkeypatch.chdir(tmp_path)  # no ./cdk-outputs.json to fall back to
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "k8s", "synth", "--profile", "p5", "--outdir", str(tmp_path / "dist")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "EcrRepositoryUri" in lines[0]
    assert not (tmp_path / "dist").exists()


def test_cli_unknown_profile_exit_2(tmp_path: Path, capsys) -> None:
    assert synth_main(["synth", "--profile", "nope", "--outdir", str(tmp_path)]) == 2
    assert "profile 'nope' not found" in capsys.readouterr().err


def test_outputs_file_in_working_directory_is_the_default(outputs_file, tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "cdk-outputs.json").write_text(outputs_file("p5").read_text())
    monkeypatch.chdir(work)
    assert synth_main(["synth", "--profile", "p5", "--run_id", "auto", "--outdir", "dist"]) == 0
    assert (work / "dist" / "30-train-auto.yaml").is_file()


# Settings the profile could not reach before every setting came from one definition.
HEADLINE = {"compile": "true", "activation_checkpointing": "selective", "global_batch_size": "64",
            "warmup_steps": "50", "snapshot_staging": "split", "deterministic": "true",
            "seq_len": "8192", "keep_checkpoints": "3"}


def test_every_trainer_setting_reaches_the_pods_from_the_profile(outputs_file) -> None:
    from k8s import commands

    profile = load_profile("p5", [f"trainer.{k}={v}" for k, v in HEADLINE.items()])
    dep = resolve(profile, load_outputs(outputs_file("p5")), run_id="r1")
    argv = commands.trainer_argv(dep)
    got = {argv[i][2:]: argv[i + 1] for i in range(0, len(argv), 2)}
    assert {k: got.get(k) for k in HEADLINE} == HEADLINE


def test_a_pod_owned_setting_is_refused_in_the_profile_with_its_reason() -> None:
    with pytest.raises(ProfileError, match=r"trainer.checkpoint_dir: set by the deployment \(the "
                                           r"run's directory on FSx\), not by a profile"):
        load_profile("p5", ["trainer.checkpoint_dir=/tmp/x"])


def test_a_model_directory_on_fsx_is_accepted_at_synth(outputs_file) -> None:
    """The synthesizing machine cannot see FSx: the path is checked in the pod, before launch."""
    profile = load_profile("p5", ["trainer.model=/fsx/models/llama-3.1-8b",
                                  "trainer.memory_budget_gib=60"])
    dep = resolve(profile, load_outputs(outputs_file("p5")), run_id="r1")
    assert dep.train.model == "/fsx/models/llama-3.1-8b"
    assert dep.tokenizer == "/fsx/models/llama-3.1-8b"  # its own tokenizer prepares the data
