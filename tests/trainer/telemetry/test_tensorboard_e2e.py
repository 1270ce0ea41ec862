"""TensorBoard of real runs through a fault, read back with TensorBoard's own event reader:
one point per step, each the surviving step's, across a whole-job restart that trains steps
again (a new process, a new writer) and across an in-process restart (the same process)."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from tests.jobs import events, faults, ok, recovery_flags, results, run_local

STEPS = 16


def _scalars(run_dir, run: str) -> dict[str, list]:
    acc = EventAccumulator(str(run_dir / "tensorboard" / run), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def _surviving_losses(run_dir) -> dict[int, float]:
    """step -> loss of the last time it was trained: the state the run kept."""
    return {e["step"]: e["loss"] for e in events(run_dir) if e["event"] == "step"}


@pytest.mark.parametrize("mode, extra", [
    ("baseline", ["--checkpoint_interval", "4"]),  # the Job restarts: steps after 4k are trained again
    ("inprocess", ["--tiers", "memory", "--snapshot_interval", "1"]),
])
def test_a_restarted_run_continues_its_curves_with_one_point_per_step(cache_dir, tmp_path,
                                                                      mode, extra):
    run_dir = tmp_path / mode
    if mode == "inprocess":
        extra = [*extra, *recovery_flags(cache_dir)]
    ok(run_local(cache_dir, mode, run_dir, "--max_steps", str(STEPS), "--log_interval", "1",
                 "--tensorboard", "true", *extra, *faults("exception", steps=STEPS, after=5)))
    res = results(run_dir)
    (failure,) = res["faults"]
    steps = [e for e in events(run_dir) if e["event"] == "step"]
    if mode == "baseline":
        assert len(steps) > STEPS, "the restart trained no step again: nothing to replace"
    train = _scalars(run_dir, "train")
    losses = _surviving_losses(run_dir)
    for tag in ("train/loss", "train/grad_norm", "train/lr", "throughput/tokens_per_second",
                "stall/checkpoint_seconds", "stall/snapshot_seconds", "goodput/training_pct",
                "goodput/infra_pct", "recovery/restarts"):
        points = [p.step for p in train[tag]]
        assert points == sorted(set(points)), f"{tag}: a duplicate or rewound step: {points}"
    assert [p.step for p in train["train/loss"]] == list(range(1, STEPS + 1))
    assert [p.value for p in train["train/loss"]] == pytest.approx([losses[s] for s in range(1, STEPS + 1)])
    assert "throughput/mfu_pct" not in train and "memory/peak_reserved_gib" not in train  # CPUs
    # The last point has the run's figures as the whole log has them.
    assert train["recovery/restarts"][-1].value == res["restarts"] >= 1
    last = train["recovery/last_recovery_seconds"][-1]
    assert last.value == pytest.approx(failure["recovery_seconds"])
    if mode == "baseline":
        assert train["checkpoint/last_committed_step"][-1].value == STEPS  # the final one
    # The failure, as results.json has it (one node: rank 0's live pass read every file).
    per_failure = _scalars(run_dir, "faults")
    assert [(p.step, p.value) for p in per_failure["recovery_seconds"]] == \
        [(1, pytest.approx(failure["recovery_seconds"]))]
    assert per_failure["steps_lost"][0].value == failure["steps_lost"]
