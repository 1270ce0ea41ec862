"""The published fault schedule, reproduced exactly, and faults that fire once."""

from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.accounting.events import EventLog, read_events
from trainer.faults.inject import FaultInjector, InjectedFault
from trainer.faults.schedule import Fault, schedule


def test_seed_42_schedule_matches_the_published_one():
    got = schedule(42, 5, 10, 2000, 16, ["exception", "hang"], [0.6, 0.4])
    assert got == [Fault(62, 4, "exception"), Fault(239, 12, "exception"), Fault(574, 12, "hang"),
                   Fault(1320, 2, "exception"), Fault(1529, 1, "exception")]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(0, 20), after=st.integers(0, 50),
       span=st.integers(20, 500), world=st.integers(2, 64))
def test_schedule_is_sorted_unique_in_range_and_spares_rank_0(seed, count, after, span, world):
    faults = schedule(seed, count, after, after + span, world, ["exception", "hang", "sigkill"])
    steps = [f.step for f in faults]
    assert steps == sorted(set(steps)) and len(steps) == count
    assert all(after < f.step <= after + span and 1 <= f.rank < world for f in faults)
    assert faults == schedule(seed, count, after, after + span, world, ["exception", "hang", "sigkill"])


def test_a_fault_fires_once_across_restarts(tmp_path):
    faults = [Fault(5, 1, "exception")]
    log = EventLog(tmp_path / "events.jsonl", rank=1)
    first = FaultInjector(faults, 1, tmp_path, log, "cpu")
    first.at_step(4)
    try:
        first.at_step(5)
        raise AssertionError("the fault did not fire")
    except InjectedFault:
        pass
    # A new process (restart) replays step 5 and trains on.
    FaultInjector(faults, 1, tmp_path, log, "cpu").at_step(5)
    FaultInjector(faults, 0, tmp_path, log, "cpu").at_step(5)  # other ranks never fire it
    assert [e["event"] for e in read_events(tmp_path / "events.jsonl")].count("fault") == 1
