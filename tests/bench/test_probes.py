"""Every bench module imports against today's trainer, and the probes that need no GPU work."""

import importlib
import json
import pkgutil

import pytest

import bench


@pytest.mark.parametrize("name", sorted(m.name for m in pkgutil.iter_modules(bench.__path__)))
def test_every_bench_module_imports(name):
    importlib.import_module(f"bench.{name}")


def test_gaps_names_the_host_work_inside_an_idle_stretch_of_the_gpu(tmp_path, capsys):
    from bench import gaps

    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_fused_adamw_", "ts": 1500, "dur": 4000},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5600, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "adamw", "ts": 6000, "dur": 500},
        {"ph": "i", "cat": "cpu_instant_event", "name": "ignored", "ts": 3000}]}
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "rank00000.trace.json").write_text(json.dumps(trace))
    assert gaps.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gaps over 2 ms: 1, 5.0 ms in all" in out
    assert "aten::_fused_adamw_ [cpu_] 4.0" in out
    assert "GPU busy 1.5 ms" in out
    assert gaps.main([str(tmp_path / "profile" / "none")]) == 2


def test_tables_turn_a_results_file_into_rows_and_refuse_other_files(tmp_path, capsys):
    from bench import tables

    fault = {"step": 17, "type": "hang", "recovery_seconds": 7.34, "restored_from": "memory"}
    results = {"machine": {"gpus": ["NVIDIA H200"]}, "results": {
        "recovery-ft_launcher-inprocess": {
            "steps_completed": 160, "max_steps": 160, "param_sha256": "79cf1a88aa", "restarts": 2,
            "faults": [fault, {**fault, "step": 39, "type": "exception", "recovery_seconds": 1.5}],
            "recovery_seconds_mean": 4.42, "infra_goodput_pct": 89.04},
        "recovery-baseline": {"exit_code": "timeout"},
        "throughput-llama-1b-seq2048-b9-compiled": {"max_steps": 60, "step_time_seconds": 0.3},
        "throughput-llama-1b-seq2048-b9-compiled-snapshots-split": {
            "max_steps": 60, "step_time_seconds": 0.312, "steady_step_seconds": 0.3122,
            "throughput_vs_no_checkpoint_pct": 98.09, "mfu_pct": 49.1,
            "snapshots": {"waits": 58}}}}
    path = tmp_path / "recovery.json"
    path.write_text(json.dumps(results))
    assert tables.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert ("| recovery-ft_launcher-inprocess | 1× H200 | 160/160 | `79cf1a88…` | 2 | 1.50 | 7.34 "
            "|  | 4.42 s | 89.0 % | memory |") in out
    assert "| recovery-baseline | 1× H200 | no results (exit timeout) |" in out
    assert "| 0.3120 s | 0.3122 s | 96.2 % / 98.1 % | 49.1 % |" in out and "| 58 |" in out
    (tmp_path / "other.json").write_text(json.dumps({"cuda_context": 0.19}))
    assert tables.main([str(tmp_path / "other.json")]) == 2
    assert "not a bench.run result file" in capsys.readouterr().err


def test_phases_table_gives_each_stage_min_max_and_what_it_added_per_fault_type(tmp_path, capsys):
    from bench import tables

    def fault(kind, recovery, **stamps):
        return {"type": kind, "recovery_seconds": recovery, "breakdown_seconds": stamps}

    run = {"faults": [fault("exception", 4.2, detected=1.4, restarted=1.5, pg_ready=2.9, loaded=3.4),
                      fault("exception", 5.0, detected=1.7, restarted=1.8, pg_ready=3.4, loaded=4.0),
                      fault("hang", 17.0, restarted=14.4, loaded=16.5),
                      {"type": "exception", "recovery_seconds": None}]}  # not resumed: left out
    path = tmp_path / "floor-results.json"  # a run's own results.json
    path.write_text(json.dumps(run))
    assert tables.main(["--phases", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| stage | floor: 2 × exception | floor: 1 × hang |" in out
    assert "| detected | 1.40-1.70 s | |" in out.replace("|  |", "| |")
    assert "| process group | 2.90-3.40 s (+1.40-1.60 s) |" in out
    # a stage a fault did not stamp: what it added counts from the last stage it did
    assert "| state loaded | 3.40-4.00 s (+0.50-0.60 s) | 16.50-16.50 s (+2.10-2.10 s) |" in out
    assert "| first step done | 4.20-5.00 s (+0.80-1.00 s) | 17.00-17.00 s (+0.50-0.50 s) |" in out


def test_hugepages_refuses_a_directory_that_cannot_hold_the_slots(tmp_path, capsys):
    from bench import hugepages

    assert hugepages.main(["--dirs", str(tmp_path / "missing")]) == 2
    assert "not a writable directory" in capsys.readouterr().err
    assert hugepages.main(["--dirs", str(tmp_path), "--slot_gb", "1e6"]) == 2
    assert "lower --slot_gb" in capsys.readouterr().err
    assert hugepages.main(["--slot_gb", "0"]) == 2
