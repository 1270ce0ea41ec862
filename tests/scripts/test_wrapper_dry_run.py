"""`--dry_run` prints exactly the kubectl commands each command would run, and needs no cluster."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from config.training import GROUPS, TrainConfig
from k8s import image
from scripts.nvrx_eks import main

NS = "kubectl --namespace nvrx"
PART_OF = "app.kubernetes.io/part-of=nvrx-eks"


@pytest.fixture
def run(outputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    """Run the wrapper in-process with --dry_run; returns (exit code, stdout lines, stderr)."""
    monkeypatch.chdir(tmp_path)
    # Dry runs must not need kubectl; git names the default image by the commit.
    only_git = tmp_path / "only-git"
    only_git.mkdir()
    (only_git / "git").symlink_to(shutil.which("git"))
    monkeypatch.setenv("PATH", str(only_git))

    def call(*argv: str, outputs_path: Path | None = outputs) -> tuple[int, list[str], str]:
        extra = ["--outputs", str(outputs_path)] if outputs_path else []
        code = main([*argv, "--profile", "p5", *extra, "--dry_run"])
        captured = capsys.readouterr()
        return code, captured.out.splitlines(), captured.err

    return call


def test_submit(run, tmp_path: Path) -> None:
    code, out, _ = run("submit", "--mode", "baseline", "--run_id", "r1")
    assert code == 0
    assert out[:2] == [
        f"{NS} apply --filename dist/p5/10-common.yaml --filename dist/p5/30-train-r1.yaml",
        "# run r1: baseline, 2x p5.48xlarge, /fsx/runs/r1",
    ]
    # then the effective trainer settings, every one of them, one line per group
    assert [line.split(":")[0] for line in out[2:]] == [f"# trainer {g}" for g in GROUPS]
    shown = " ".join(out[2:])
    assert all(f" {name}=" in shown for name in TrainConfig.model_fields)
    assert " compile=false " in shown and " checkpoint_dir=/fsx/runs/r1/checkpoints " in shown
    assert not (tmp_path / "dist").exists()  # dry-run writes nothing


def test_submit_with_an_override_is_validated_as_the_file_is(run) -> None:
    code, out, _ = run("submit", "--run_id", "r1", "--set", "trainer.compile=true",
                       "--set", "trainer.global_batch_size=64")
    assert code == 0
    shown = " ".join(out)
    assert " compile=true " in shown and " global_batch_size=64 " in shown
    code, _, err = run("submit", "--run_id", "r1", "--set", "trainer.compil=true")
    assert code == 2 and err.strip().splitlines() == [
        "nvrx-eks: error: profile 'p5': trainer.compil: unknown key; did you mean 'compile'?"]
    code, _, err = run("submit", "--run_id", "r1", "--set", "trainer.global_batch_size=3")
    assert code == 2 and "global batch size 3 cannot be kept at world size 16" in err
    assert len(err.strip().splitlines()) == 1


def test_submit_applies_the_namespace_when_the_stack_does_not_own_it(run, tmp_path: Path, outputs: Path) -> None:
    stacks = json.loads(outputs.read_text())
    del stacks["NvrxCluster"]["Namespace"]
    other = tmp_path / "no-namespace.json"
    other.write_text(json.dumps(stacks))
    code, out, _ = run("submit", "--run_id", "r2", outputs_path=other)
    assert code == 0
    assert out[0] == f"{NS} apply --filename dist/p5/00-namespace.yaml"
    assert out[1].endswith("--filename dist/p5/30-train-r2.yaml")


def test_prepare_data(run) -> None:
    code, out, _ = run("prepare-data", "--wait")
    assert code == 0
    assert out == [
        f"{NS} delete job data-prep --ignore-not-found --wait=true",
        f"{NS} apply --filename dist/p5/10-common.yaml --filename dist/p5/20-data-prep.yaml",
        "# until Complete or Failed, every 10 s for at most 7200 s:",
        f"{NS} get job data-prep --output "
        """'jsonpath={.status.active}{" "}{.status.succeeded}{" "}{.status.failed}{" "}"""
        """{range .status.conditions[?(@.status=="True")]}{.type}{" "}{end}'""",
    ]


def test_status_of_one_run_and_of_all(run) -> None:
    code, out, _ = run("status", "--run_id", "r1")
    assert code == 0 and len(out) == 2
    assert out[0].startswith(
        f"{NS} get jobs --selector {PART_OF},app.kubernetes.io/component=train,nvrx-eks/run-id=r1 "
    )
    assert "FAILED_PODS:.status.failed" in out[0]
    assert out[1].startswith(
        f"{NS} get pods --selector {PART_OF},app.kubernetes.io/component=train,nvrx-eks/run-id=r1 "
    )
    assert "RANK:.metadata.annotations.batch" in out[1] and "PHASE:.status.phase" in out[1]
    code, out, _ = run("status")
    assert code == 0 and "nvrx-eks/run-id" not in out[0]


def test_logs_of_a_rank(run) -> None:
    code, out, _ = run("logs", "--run_id", "r1", "--rank", "1", "--follow")
    assert code == 0
    assert out == [
        f"{NS} logs --container trainer --follow "
        f'"$({NS} get pods --selector nvrx-eks/run-id=r1,batch.kubernetes.io/job-completion-index=1 '
        "--sort-by .metadata.creationTimestamp --output 'jsonpath={.items[-1:].metadata.name}')\""
    ]


def test_results(run, tmp_path: Path) -> None:
    code, out, _ = run("results", "--run_id", "r1")
    assert code == 0
    assert out[:3] == [
        f"{NS} apply --filename dist/p5/40-results-r1.yaml",
        f"{NS} wait --for=condition=Ready pod/results-r1 --timeout=10m",
        f"{NS} cp --container results results-r1:/fsx/runs/r1/results.json runs/r1/results.json",
    ]
    assert f"{NS} cp --container results results-r1:/fsx/runs/r1/report runs/r1/report" in out
    assert out[-2] == f"{NS} delete pod,networkpolicy results-r1 --ignore-not-found --wait=false"
    assert not (tmp_path / "runs").exists()  # dry-run copies nothing
    assert not (tmp_path / "dist").exists()  # and writes no manifest


def test_watch(run, tmp_path: Path) -> None:
    code, out, _ = run("watch", "--run_id", "r1", "--once")
    assert code == 0
    assert out == [
        f"{NS} apply --filename dist/p5/45-watch-r1.yaml",
        f"{NS} wait --for=condition=Ready pod/watch-r1 --timeout=10m",
        f"{NS} exec watch-r1 --container results -- python -m trainer.telemetry.status /fsx/runs/r1 "
        "--interval 10 --once",
        f"{NS} delete pod,networkpolicy watch-r1 --ignore-not-found --wait=false",
    ]
    assert not (tmp_path / "dist").exists()


def test_watch_refuses_a_bad_interval(run) -> None:
    code, _, err = run("watch", "--run_id", "r1", "--interval", "0")
    assert code == 2 and "--interval 0 must be positive" in err


def test_export(run, tmp_path: Path) -> None:
    code, out, _ = run("export", "--run_id", "r1", "--format", "hf")
    assert code == 0
    assert out == [
        f"{NS} delete job export-hf-r1 --ignore-not-found --wait=true",
        f"{NS} apply --filename dist/p5/10-common.yaml --filename dist/p5/50-export-r1.yaml",
        "# export of r1: the newest committed checkpoint as hf fp32, into /fsx/runs/r1/export/hf-step<N>",
        f"# follow it: {NS} logs --follow job/export-hf-r1",
    ]
    code, out, _ = run("export", "--run_id", "r1", "--format", "dcp", "--step", "500", "--dtype", "bf16",
                       "--optimizer", "--wait", "--timeout", "30m")
    assert code == 0
    assert out[0] == f"{NS} delete job export-dcp-r1 --ignore-not-found --wait=true"
    assert out[2] == "# export of r1: step 500 as dcp bf16, into /fsx/runs/r1/export/dcp-bf16-step500"
    assert out[3:] == [
        "# until Complete or Failed, every 10 s for at most 1800 s:",
        f"{NS} get job export-dcp-r1 --output "
        """'jsonpath={.status.active}{" "}{.status.succeeded}{" "}{.status.failed}{" "}"""
        """{range .status.conditions[?(@.status=="True")]}{.type}{" "}{end}'""",
    ]
    assert not (tmp_path / "dist").exists()


def test_export_refuses_bad_choices_in_one_line(run) -> None:
    for argv, message in ((("--format", "hf", "--optimizer"), "--optimizer applies to --format dcp, not hf"),
                          (("--format", "hf", "--step", "-1"), "--step -1 must be a step number")):
        code, out, err = run("export", "--run_id", "r1", *argv)
        assert code == 2 and out == [] and len(err.strip().splitlines()) == 1 and message in err
    with pytest.raises(SystemExit) as exit_:
        run("export", "--run_id", "r1", "--format", "gguf")
    assert exit_.value.code == 2


def test_stop(run) -> None:
    code, out, _ = run("stop", "--run_id", "r1")
    assert code == 0
    assert out[:2] == [
        f"{NS} delete job train-r1 --cascade=foreground --wait=true --ignore-not-found --timeout=15m",
        f"{NS} delete service,configmap,networkpolicy train-r1 --ignore-not-found",
    ]
    assert out[2] == f"{NS} delete deployment,service,poddisruptionbudget,networkpolicy train-r1-store --ignore-not-found"


def test_cleanup_deletes_fsx_users_first_and_keeps_namespace(run) -> None:
    code, out, _ = run("cleanup")
    assert code == 0
    assert out == [
        f"{NS} delete jobs --selector {PART_OF} --cascade=foreground --wait=true --ignore-not-found --timeout=15m",
        f"{NS} delete deployments,daemonsets --selector {PART_OF} --cascade=foreground --wait=true "
        "--ignore-not-found --timeout=15m",
        f"{NS} delete pods --selector {PART_OF} --wait=true --ignore-not-found --timeout=15m",
        f"{NS} delete networkpolicies,services,configmaps,serviceaccounts,poddisruptionbudgets --selector {PART_OF} "
        "--ignore-not-found",
        "# namespace 'nvrx' and the FSx claim are left to `cdk destroy`",
    ]
    targets = [line.split()[4] for line in out if line.startswith(NS)]
    assert not any("namespace" in t or "persistentvolume" in t for t in targets)


def test_synth_prints_the_manifests(run, tmp_path: Path) -> None:
    code, out, _ = run("synth", "--mode", "inprocess", "--run_id", "r1")
    assert code == 0
    text = "\n".join(out)
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert {d["kind"] for d in docs} == {
        "Namespace",
        "ServiceAccount",
        "DaemonSet",
        "Job",
        "ConfigMap",
        "Service",
        "NetworkPolicy",
        "Pod",
    }
    assert "# 30-train-r1.yaml" in out
    assert not (tmp_path / "dist").exists()


def test_context_flag_is_passed_through(run) -> None:
    code, out, _ = run("stop", "--run_id", "r1", "--context", "other")
    assert code == 0 and out[0].startswith("kubectl --context other --namespace nvrx delete job train-r1 ")


@pytest.mark.parametrize("command", ["logs", "results", "stop"])
def test_dry_run_cannot_find_the_latest_run(run, command: str) -> None:
    code, out, err = run(command)
    assert code == 2 and out == []
    assert err.strip() == "nvrx-eks: error: --dry_run cannot look up the latest run: pass --run_id"


def test_missing_outputs_value_names_the_key(run) -> None:
    code, out, err = run("submit", outputs_path=None)
    assert code == 2 and out == []
    assert len(err.strip().splitlines()) == 1
    assert "missing required value 'EcrRepositoryUri'" in err


def test_rank_out_of_range(run) -> None:
    code, _, err = run("logs", "--run_id", "r1", "--rank", "2")
    assert code == 2 and "--rank 2 is not a node rank of 2 nodes" in err


def test_outputs_for_another_profile(run, tmp_path: Path, outputs: Path) -> None:
    stacks = json.loads(outputs.read_text())
    stacks["NvrxCluster"]["Region"] = "eu-west-1"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(stacks))
    code, _, err = run("status", outputs_path=other)
    assert code == 2 and "Region 'eu-west-1'" in err and "disagrees with profile 'p5'" in err


def test_image_reference_for_make_image(run) -> None:
    code, out, _ = run("image")
    assert code == 0
    assert out == [f"123456789012.dkr.ecr.us-east-2.amazonaws.com/nvrx-trainer:{image.commit_tag()}"]
    code, out, _ = run("image", "--image_tag", "nvrx-0.4.1")
    assert code == 0 and out == ["123456789012.dkr.ecr.us-east-2.amazonaws.com/nvrx-trainer:nvrx-0.4.1"]


def test_make_image_refuses_latest(run) -> None:
    code, out, err = run("image", "--image_tag", "latest")
    assert code == 2 and out == [] and "image tag 'latest' moves with every push" in err
