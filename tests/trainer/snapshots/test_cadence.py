"""The snapshot cadence (`trainer.snapshots.cadence`): what `auto` measures and chooses, and the
warning a fixed interval gets when it costs more than it should."""

import torch

from trainer.snapshots.cadence import PROBE_GAP, PROBE_STEPS, WARMUP_STEPS, Cadence

CPU = torch.device("cpu")


def run(cadence: Cadence, steps: int, step_s: float, cost_s: float) -> list[int]:
    """Feed `steps` steps as the loop reports them; a snapshot costs `cost_s` on the next step
    (as a GPU's fence makes it) and nothing on the host. Returns the snapshot steps."""
    taken, before = [], False
    for step in range(cadence.start + 1, cadence.start + steps + 1):
        dt = step_s + (cost_s if before else 0.0)
        before = cadence.due(step)
        if before:
            taken.append(step)
        cadence.observe(step, dt, 1e-6 if before else 0.0, before)
    return taken


def test_auto_measures_then_takes_the_fewest_steps_that_keep_snapshots_under_1pct():
    lines = []
    cadence = Cadence("auto", start=10, device=CPU, log=lines.append)
    taken = run(cadence, 80, step_s=0.1, cost_s=0.025)
    first = 10 + WARMUP_STEPS + PROBE_STEPS
    probe = [first + i * PROBE_GAP for i in range(PROBE_STEPS)]
    assert taken[:PROBE_STEPS] == probe  # the probe's snapshots, spaced, none before
    assert cadence.interval == 26  # 0.025 s (+ 1 us taking it) against 1 % of 0.1 s
    gaps = {b - a for a, b in zip(taken[PROBE_STEPS:], taken[PROBE_STEPS + 1:])}
    assert gaps == {26}
    figures = cadence.figures
    assert figures["auto"] and figures["overhead_pct"] <= 1.0
    assert figures["expected_loss_steps"] == 13
    assert len(lines) == 1 and "snapshots every 26 step(s) (auto)" in lines[0]


def test_a_snapshot_that_hides_under_compute_is_taken_every_step():
    cadence = Cadence("auto", start=0, device=CPU, log=lambda line: None)
    run(cadence, 30, step_s=0.5, cost_s=0.0)
    assert cadence.interval == 1


def test_a_fixed_interval_is_kept_and_warned_about_once_when_it_costs_over_5pct():
    lines = []
    cadence = Cadence(2, start=0, device=CPU, log=lines.append)
    taken = run(cadence, 40, step_s=0.1, cost_s=0.05)
    assert taken == list(range(2, 41, 2))
    assert cadence.figures["overhead_pct"] > 5 and cadence.figures["interval_for_1pct"] == 51
    assert [line for line in lines if "warning" in line] == [
        next(line for line in lines if "warning" in line)]
    assert "--snapshot_interval 51 (or auto)" in lines[-1]


def test_a_snapshot_of_every_step_is_honoured_without_figures():
    cadence = Cadence(1, start=0, device=CPU, log=lambda line: None)
    assert run(cadence, 12, step_s=0.1, cost_s=0.05) == list(range(1, 13))
    assert cadence.figures == {}
