"""Wrapper input checks, the data-prep wait, stop and lost-node (plan: test_plan.py).

Bad input is one line on stderr and exit 2 before kubectl runs; real-mode commands run against
the fake kubectl of conftest, whose argv log shows exactly what reached kubectl.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts.nvrx_eks import JOB_STATE, job_state, main

BAD_RUN_IDS = ("../x", "x --all", "x,nvrx-eks/run-id=y", "X", "-x", "a b")


@pytest.mark.parametrize("command", ["stop", "status", "logs", "results", "watch", "export"])
@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_run_ids_are_checked_before_kubectl(command, run_id, fake_kubectl, outputs: Path, capsys) -> None:
    extra = ["--format", "hf"] if command == "export" else []
    code = main([command, "--profile", "p5", "--outputs", str(outputs), f"--run_id={run_id}", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("nvrx-eks: error: run id ") and err.count("\n") == 1
    assert not [c for c in fake_kubectl.calls() if c[:2] != ["config", "view"]]


def test_dry_run_writes_no_file(outputs: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for argv in (["submit", "--run_id", "r1"], ["prepare-data"], ["results", "--run_id", "r1"],
                 ["export", "--run_id", "r1", "--format", "dcp"]):
        assert main([*argv, "--profile", "p5", "--outputs", str(outputs), "--dry_run"]) == 0
    assert list(work.iterdir()) == []


def test_prepare_data_wait_stops_on_a_failed_job(fake_kubectl, outputs: Path, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_JOB_CONDITIONS", "  1 FailureTarget Failed ")
    code = main(["prepare-data", "--profile", "p5", "--outputs", str(outputs), "--wait", "--timeout", "1h"])
    assert code == 2
    captured = capsys.readouterr()
    assert "Job 'data-prep' failed" in captured.err
    # the seconds the wait took (one kubectl call: 0 s, or more on a loaded machine) are not checked
    assert re.search(r"Job data-prep: 0 active, 0 succeeded, 1 failed \(FailureTarget, Failed\), "
                     r"\d+ s of at most 3600 s", captured.out)


def test_prepare_data_wait_returns_on_complete(fake_kubectl, outputs: Path, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_JOB_CONDITIONS", " 1  SuccessCriteriaMet Complete ")
    assert main(["prepare-data", "--profile", "p5", "--outputs", str(outputs), "--wait"]) == 0
    assert fake_kubectl.calls()[-1][-3:] == ["data-prep", "--output", f"jsonpath={JOB_STATE}"]
    assert "Job data-prep: 0 active, 1 succeeded, 0 failed (SuccessCriteriaMet, Complete)" in capsys.readouterr().out


@pytest.mark.parametrize("answer, line, conditions", [
    ("1   ", "1 active, 0 succeeded, 0 failed", set()),  # kubectl leaves unset counts empty
    ("   ", "0 active, 0 succeeded, 0 failed", set()),  # not started yet
    ("2 3 1 Suspended ", "2 active, 3 succeeded, 1 failed (Suspended)", {"Suspended"}),
])
def test_job_state_lines(answer, line, conditions) -> None:
    assert job_state(answer) == (line, conditions)


def test_bad_wait_timeout_is_refused(fake_kubectl, outputs: Path, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["prepare-data", "--profile", "p5", "--outputs", str(outputs), "--wait", "--timeout", "soon"]) == 2
    assert "--timeout 'soon'" in capsys.readouterr().err


def test_stop_removes_the_runs_objects(fake_kubectl, outputs: Path) -> None:
    assert main(["stop", "--profile", "p5", "--outputs", str(outputs), "--run_id", "r1"]) == 0
    calls = [c for c in fake_kubectl.calls() if c[:2] != ["config", "view"]]
    assert calls == [
        ["--namespace", "nvrx", "delete", "job", "train-r1", "--cascade=foreground", "--wait=true",
         "--ignore-not-found", "--timeout=15m"],
        ["--namespace", "nvrx", "delete", "service,configmap,networkpolicy", "train-r1", "--ignore-not-found"],
        ["--namespace", "nvrx", "delete", "deployment,service,poddisruptionbudget,networkpolicy", "train-r1-store",
         "--ignore-not-found"],
    ]


def test_lost_node_force_deletes_only_our_pods_on_that_node(fake_kubectl, outputs: Path) -> None:
    node = "ip-10-0-1-23.us-east-2.compute.internal"
    assert main(["lost-node", "--profile", "p5", "--outputs", str(outputs), "--node", node]) == 0
    assert fake_kubectl.calls()[-1] == [
        "--namespace", "nvrx", "delete", "pods", "--selector", "app.kubernetes.io/part-of=nvrx-eks",
        "--field-selector", f"spec.nodeName={node}", "--force", "--grace-period=0", "--ignore-not-found",
    ]


@pytest.mark.parametrize("node", ["x --all", "a,b", "../n", "Node1"])
def test_lost_node_refuses_bad_names(node, fake_kubectl, outputs: Path, capsys) -> None:
    assert main(["lost-node", "--profile", "p5", "--outputs", str(outputs), "--node", node]) == 2
    assert "is not a Kubernetes node name" in capsys.readouterr().err
