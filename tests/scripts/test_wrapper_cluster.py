"""Real mode against a fake kubectl: preflight errors, lookups, and the order of the calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.nvrx_eks import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(outputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.chdir(tmp_path)

    def call(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--profile", "p5", "--outputs", str(outputs)])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


def verbs(calls: list[list[str]]) -> list[list[str]]:
    """Calls without the `--namespace nvrx` prefix, config queries dropped."""
    return [c[2:] if c[:2] == ["--namespace", "nvrx"] else c for c in calls if c[:2] != ["config", "view"]]


def test_kubectl_missing(run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, out, err = run("status")
    assert code == 2 and out == ""
    assert err.strip() == (
        "nvrx-eks: error: kubectl not found on PATH: install kubectl, then run "
        "`aws eks update-kubeconfig --name nvrx-p5 --region us-east-2`"
    )


def test_no_current_context(run, fake_kubectl, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_KUBECONFIG", json.dumps({"contexts": []}))
    code, _, err = run("status")
    assert code == 2
    assert "no current kube context: run `aws eks update-kubeconfig --name nvrx-p5 --region us-east-2`" in err
    assert verbs(fake_kubectl.calls()) == []  # nothing reached the cluster


def test_context_of_another_cluster(run, fake_kubectl, make_kubeconfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_KUBECONFIG", make_kubeconfig(cluster="arn:aws:eks:us-east-2:1:cluster/someone-else"))
    code, _, err = run("submit")
    assert code == 2
    assert "points at cluster 'arn:aws:eks:us-east-2:1:cluster/someone-else', not 'nvrx-p5'" in err


def test_explicit_context_is_checked_and_used(run, fake_kubectl, make_kubeconfig, monkeypatch) -> None:
    config = json.loads(make_kubeconfig(context="eks"))
    config["current-context"] = "laptop"
    config["contexts"].append({"name": "laptop", "context": {"cluster": "kind"}})
    monkeypatch.setenv("FAKE_KUBECONFIG", json.dumps(config))
    code, _, _ = run("stop", "--run_id", "r1", "--context", "eks")
    assert code == 0
    assert fake_kubectl.calls()[-1][:4] == ["--context", "eks", "--namespace", "nvrx"]


def test_submit_applies_common_and_run(run, fake_kubectl, tmp_path: Path) -> None:
    code, out, _ = run("submit", "--mode", "ft_launcher", "--run_id", "r1")
    assert code == 0 and "# run r1: ft_launcher" in out
    assert verbs(fake_kubectl.calls()) == [
        ["apply", "--filename", "dist/p5/10-common.yaml", "--filename", "dist/p5/30-train-r1.yaml"]
    ]
    assert (tmp_path / "dist/p5/30-train-r1.yaml").is_file()


def test_logs_finds_latest_run_and_newest_pod(run, fake_kubectl, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = {
        "items": [
            {"metadata": {"creationTimestamp": "2026-11-29T10:00:00Z", "labels": {"nvrx-eks/run-id": "new"}}},
            {"metadata": {"creationTimestamp": "2026-11-28T10:00:00Z", "labels": {"nvrx-eks/run-id": "old"}}},
        ]
    }
    monkeypatch.setenv("FAKE_JOBS", json.dumps(jobs))
    monkeypatch.setenv("FAKE_POD", "train-new-1-abcde")
    code, _, _ = run("logs", "--rank", "1")
    assert code == 0
    calls = verbs(fake_kubectl.calls())
    assert calls[0][:2] == ["get", "jobs"]
    assert calls[1][:4] == [
        "get",
        "pods",
        "--selector",
        "nvrx-eks/run-id=new,batch.kubernetes.io/job-completion-index=1",
    ]
    assert calls[2] == ["logs", "--container", "trainer", "train-new-1-abcde"]


def test_logs_without_any_run(run, fake_kubectl) -> None:
    code, _, err = run("logs")
    assert code == 2 and "no training runs in namespace 'nvrx'" in err


def test_results_copies_and_always_deletes_the_pod(run, fake_kubectl, tmp_path: Path) -> None:
    code, out, _ = run("results", "--run_id", "r1")
    assert code == 0
    calls = verbs(fake_kubectl.calls())
    assert calls[0] == ["apply", "--filename", "dist/p5/40-results-r1.yaml"]
    copied = [c[-1] for c in calls if c[0] == "cp"]
    assert copied == ["runs/r1/results.json", "runs/r1/events", "runs/r1/tensorboard", "runs/r1/settings.json",
                      "runs/r1/report"]
    assert "# events not copied (not written to /fsx/runs/r1 yet?); skipped" in out  # the fake fails that copy
    assert calls[-1] == ["delete", "pod,networkpolicy", "results-r1", "--ignore-not-found", "--wait=false"]
    assert (tmp_path / "runs/r1").is_dir()
    assert out.splitlines()[-1].startswith("# results of r1 in runs/r1/")


def test_results_of_a_run_still_training_copies_what_exists(run, fake_kubectl, monkeypatch) -> None:
    """No results.json before training ends: the event log and the rest are copied all the same."""
    monkeypatch.setenv("FAKE_CP_MISSING", "/results.json")
    code, out, _ = run("results", "--run_id", "r1")
    assert code == 0
    assert "# results.json not copied (not written to /fsx/runs/r1 yet?); skipped" in out
    assert [c[-1] for c in verbs(fake_kubectl.calls()) if c[0] == "cp"][1] == "runs/r1/events"
    assert out.splitlines()[-1] == (
        "# events, tensorboard, settings.json, report of r1 in runs/r1/; no results.json: training has "
        "not ended (its view so far: python -m devtools.watch runs/r1 --once)")


def test_watch_runs_the_view_in_its_own_pod_and_always_deletes_it(run, fake_kubectl) -> None:
    code, out, _ = run("watch", "--run_id", "r1", "--interval", "5")
    assert code == 0
    calls = verbs(fake_kubectl.calls())
    assert calls[0] == ["apply", "--filename", "dist/p5/45-watch-r1.yaml"]
    assert calls[1] == ["wait", "--for=condition=Ready", "pod/watch-r1", "--timeout=10m"]
    assert calls[2] == ["exec", "watch-r1", "--container", "results", "--", "python", "-m",
                        "trainer.telemetry.status", "/fsx/runs/r1", "--interval", "5"]
    assert calls[-1] == ["delete", "pod,networkpolicy", "watch-r1", "--ignore-not-found", "--wait=false"]


def test_cleanup_order(run, fake_kubectl) -> None:
    code, _, _ = run("cleanup")
    assert code == 0
    kinds = [c[1] for c in verbs(fake_kubectl.calls())]
    assert kinds == ["jobs", "deployments,daemonsets", "pods",
                     "networkpolicies,services,configmaps,serviceaccounts,poddisruptionbudgets"]


def test_kubectl_failure_exit_code_is_passed_on(run, fake_kubectl) -> None:
    script = fake_kubectl.bin_dir / "kubectl.py"
    script.write_text(script.read_text() + "if 'train-r1' in args:\n    sys.exit(3)\n")
    code, _, err = run("stop", "--run_id", "r1")
    assert code == 3
    assert err.startswith("nvrx-eks: error: `kubectl --namespace nvrx delete job train-r1 ")
    assert err.strip().endswith("failed with exit code 3")


def test_shim_runs_from_anywhere(tmp_path: Path) -> None:
    env = {**os.environ, "NVRX_EKS_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(REPO / "scripts/nvrx-eks"), "--help"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("synth", "submit", "prepare-data", "status", "logs", "results", "export", "stop", "cleanup"):
        assert command in proc.stdout
