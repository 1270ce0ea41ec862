"""The benchmark harness on CPU ranks: a run past its limit is stopped whole."""

import json
import os
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real benchmark runs on CPU


def _processes_naming(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def test_a_run_past_its_limit_leaves_no_trainer_running(cache_dir, tmp_path, monkeypatch):
    """The launchers run in their own sessions: killing only the local runner would leave the
    trainers writing into checkpoints the harness removes next, and holding the next run's GPUs."""
    from bench import run as bench

    monkeypatch.setenv("NVRX_EKS_CACHE", str(cache_dir))
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    name = f"test-limit-{os.getpid()}"
    run_dir = str(bench.ROOT / "runs" / "bench" / name)
    res = bench._train(name, tmp_path, "baseline", 2,
                       [*bench._model_args("tiny", 2, 64, None), "--max_steps", "100000"],
                       timeout=20)
    for log in bench.LOGS.glob(f"{name}.*"):
        log.unlink()
    assert res["exit_code"] == "timeout"
    assert not _processes_naming(run_dir), "trainers outlived the run's limit"


def test_steady_step_seconds_leaves_the_warm_up_out_and_refuses_a_restarted_run(tmp_path):
    from bench.run import steady_step_seconds

    def write(steps):
        path = tmp_path / "events.jsonl"
        path.write_text("\n".join(json.dumps({"t": d + 0.01, "event": "step", "rank": r, "step": s,
                                              "dt": 0.2, "done": d})
                                  for s, d in steps for r in (0, 1)) + "\n")
        return path

    # warm-up steps of 5 s and 1 s, then 0.2 s a step with one 0.6 s stall
    done = [(1, 5.0), (2, 6.0), (3, 6.2), (4, 6.4), (5, 7.0), (6, 7.2)]
    assert steady_step_seconds(write(done)) == pytest.approx((7.2 - 6.0) / 4)
    assert steady_step_seconds(write(done + [(4, 8.0)])) is None  # step 4 again: a restart
    assert steady_step_seconds(write(done[:3])) is None


def test_throughput_runs_snapshots_alone_and_with_a_durable_write_beside_the_reference(
        tmp_path, monkeypatch):
    from bench import run as bench

    runs = {}

    def train(name, out, mode, nproc, args, local=(), timeout=600):
        runs[name] = args
        return {"name": name, "steady_step_seconds": 0.2 if name.endswith("-compiled") else 0.25}

    monkeypatch.setattr(bench, "_train", train)
    res = bench.throughput(tmp_path, "tiny", 2, 4, 64, 40, "memory,node", 1, ["host", "device"],
                           [], None, ["compiled", "compiled-snapshots", "compiled-ft"])
    label = "throughput-tiny-seq64-b4"
    assert list(runs) == [f"{label}-compiled", f"{label}-compiled-snapshots-host",
                          f"{label}-compiled-snapshots-device", f"{label}-compiled-ft-host",
                          f"{label}-compiled-ft-device"]
    alone = runs[f"{label}-compiled-snapshots-device"]
    assert "--tiers" in alone and alone[alone.index("--checkpoint_interval") + 1] == "0"
    with_write = runs[f"{label}-compiled-ft-host"]
    assert with_write[with_write.index("--checkpoint_interval") + 1] == "20"
    assert res[f"{label}-compiled-ft-host"]["throughput_vs_no_checkpoint_pct"] == 80.0
    runs.clear()
    bench.throughput(tmp_path, "tiny", 2, 4, 64, 40, "none", 1, ["host"], [], None,
                     ["compiled-snapshots", "compiled-ft"])
    assert list(runs) == [f"{label}-compiled-ft"] and "--tiers" not in runs[f"{label}-compiled-ft"]


def test_the_log_bundle_leaves_out_logs_of_earlier_invocations(tmp_path, monkeypatch):
    """A GPU machine keeps runs/bench between invocations of gpu.sh: only this one's logs are
    packed."""
    from bench import run as bench

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "old.log").write_text("earlier invocation")
    (logs / "new.log").write_text("this invocation")
    os.utime(logs / "old.log", (1000.0, 1000.0))
    monkeypatch.setattr(bench, "LOGS", logs)
    monkeypatch.setenv(bench.SINCE_ENV, "2000")
    bench.bundle(tmp_path)
    with tarfile.open(tmp_path / "logs.tar.gz") as tar:
        assert tar.getnames() == ["new.log"]


def test_recovery_runs_take_their_per_mode_settings_from_the_mode_table(monkeypatch):
    """The values the recovery benchmarks measured with, derived from the modes' traits;
    a mode without a measured limit gets the largest one of its kind."""
    from bench import run as bench

    expected = {"baseline": ("--backoff_seconds", "1"),
                "ft_launcher": ("--heartbeat_timeout", "10"),
                "inprocess": (),
                "ft_launcher+inprocess": ("--heartbeat_timeout", "60")}
    for mode, flags in expected.items():
        assert bench.recovery_local(mode) == flags
        args = bench._recovery_args("tiny", 1, 64, 40, None, False, mode)
        assert ("--tiers" in args) == (mode != "baseline")  # the published baseline: no tiers
    assert bench.run_limit("recovery", "inprocess") == 300
    monkeypatch.setitem(bench.RUN_LIMITS, "recovery", {"baseline": 540, "ft_launcher": 380})
    assert bench.run_limit("recovery", "inprocess") == 540
