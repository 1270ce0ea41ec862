"""The loss curve depends on the global batch alone: not on the world size, the micro-batch,
or a resume at another world size. Real jobs on CPU ranks (gloo)."""

import math
import shutil

from tests.jobs import events, ok, results, run_local
from trainer.durable.store import step_dir_name

STEPS, SAVE_AT = 6, 3


def _losses(run_dir) -> dict[int, float]:
    """step -> loss (the global mean over the step's tokens), the last occurrence of each."""
    return {e["step"]: e["loss"] for e in events(run_dir) if e["event"] == "step"}


def _close(a: dict[int, float], b: dict[int, float], steps) -> None:
    for s in steps:
        assert math.isclose(a[s], b[s], rel_tol=2e-3), (s, a[s], b[s])


def test_world_1_batch_4_equals_world_2_batch_2_also_across_a_resume(cache_dir, tmp_path):
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(SAVE_AT))
    one = tmp_path / "world1-batch4"
    ok(run_local(cache_dir, "baseline", one, *args, "--batch_size", "4", nproc=1))
    two = tmp_path / "world2-batch2"
    ok(run_local(cache_dir, "baseline", two, *args, "--batch_size", "2",
                 "--activation_checkpointing", "selective", nproc=2))
    assert results(one)["global_batch_size"] == results(two)["global_batch_size"] == 4
    reference = _losses(one)
    assert sorted(reference) == list(range(1, STEPS + 1))
    _close(reference, _losses(two), range(1, STEPS + 1))

    # World 2's step-3 checkpoint, resumed by one rank with micro-batches of 2: the checkpoint's
    # global batch (4) is kept by accumulating two micro-batches per step.
    resumed = tmp_path / "resumed-world1-batch2"
    shutil.copytree(two / "checkpoints" / step_dir_name(SAVE_AT),
                    resumed / "checkpoints" / step_dir_name(SAVE_AT))
    ok(run_local(cache_dir, "baseline", resumed, *args, "--batch_size", "2", "--resume", "required",
                 nproc=1))
    res = results(resumed)
    assert res["global_batch_size"] == 4 and res["accumulation_steps"] == 2
    after = _losses(resumed)
    assert sorted(after) == list(range(SAVE_AT + 1, STEPS + 1))
    _close(reference, after, range(SAVE_AT + 1, STEPS + 1))


def test_a_global_batch_the_world_cannot_keep_is_refused(cache_dir, tmp_path):
    proc = run_local(cache_dir, "baseline", tmp_path / "run", "--max_steps", "2",
                     "--global_batch_size", "6", nproc=2, local_args=("--job_restarts", "0"))
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "global batch size 6 cannot be kept at world size 2" in out
    assert "--batch_size 2 x 2 ranks = 4" in out
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").glob("step_*"))
