"""A forced compute dtype, end to end: two real ranks computing in fp32 through in-process
restarts end with the fp32 fault-free run's parameters, and say what they compute in once."""

from tests.jobs import INTERVAL, STEPS, faults, faults_fired, ok, results, run_local


def test_forced_fp32_recovers_to_its_fault_free_hash(cache_dir, pace, reference, tmp_path):
    fp32 = ("--compute_dtype", "fp32")
    ref = reference(extra=fp32)
    assert ref["compute_dtype"] == "fp32" and ref["config"]["compute_dtype"] == "fp32"
    run_dir = tmp_path / "run"
    proc = run_local(cache_dir, "inprocess", run_dir, "--max_steps", str(STEPS),
                     "--checkpoint_interval", str(INTERVAL), *fp32, *pace.recovery_flags(),
                     *faults("exception", "hang"))
    ok(proc)
    res = results(run_dir)
    assert [f["type"] for f in faults_fired(run_dir)] == ["exception", "hang"]
    assert res["restarts"] >= 2
    assert res["compute_dtype"] == "fp32" and res["param_sha256"] == ref["param_sha256"]
    # rank 0's line, once per process: not again on either in-process restart
    assert proc.stdout.count("compute dtype fp32: --compute_dtype fp32") == 1, proc.stdout
