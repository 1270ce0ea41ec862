"""An in-process attempt's hooks: fresh per attempt, sharing what must survive it."""

from trainer.hooks import Hooks, ProcessState


def test_attempt_hooks_share_callbacks_and_process_state_but_not_counters():
    pings: list[str] = []
    base = Hooks(keepalive=[lambda: pings.append("heartbeat")])
    base.on_ready.append(lambda: None)
    base.stateful["client"] = object()
    base.process.leased = True
    base.steps_done = 7

    first = base.for_attempt(1, store=None, ping=lambda: pings.append("ping1"))
    first.steps_done = 3
    second = base.for_attempt(2, store=None, ping=lambda: pings.append("ping2"))

    assert (first.iteration, second.iteration, second.steps_done) == (1, 2, 0)
    assert second.process is base.process and isinstance(second.process, ProcessState)
    assert second.process.leased
    assert second.on_ready is base.on_ready and second.stateful is base.stateful
    assert len(base.keepalive) == 1  # an attempt's ping never leaks into the next attempt
    second.alive()
    assert pings == ["heartbeat", "ping2"]
    second.alive()  # throttled: at most every KEEPALIVE_S
    assert pings == ["heartbeat", "ping2"]
