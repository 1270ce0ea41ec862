"""Per-rank cost does not grow with the world size: every step of checkpointing and recovery,
measured on one rank of worlds of 32 and 512 ranks (`bench.scale`, one process per rank)."""

from __future__ import annotations

import pytest

from bench import scale

pytestmark = pytest.mark.slow  # a process per measurement, each importing torch

SMALL, LARGE = 32, 512
CALLS = ("all_reduce_calls", "barrier_calls", "broadcast_calls", "broadcast_object_list_calls",
         "all_gather_object_calls", "isend_calls", "irecv_calls", "new_group_calls", "store_ops",
         "fs_stats", "fs_opens", "fs_listings", "p2p_peers")
FLAT = [(op, who) for op in scale.OPERATIONS for who in scale.subjects(op)
        if who == "rank" or op in scale.RANK0_ONLY]


def _rank(op: str, who: str, world: int) -> int:
    return 0 if who == "rank0" else scale.playing_rank(op, world)


@pytest.mark.parametrize("op,who", FLAT, ids=[f"{op}-{who}" for op, who in FLAT])
def test_a_rank_does_the_same_work_in_a_world_sixteen_times_larger(op, who):
    small = scale.measure(op, SMALL, _rank(op, who, SMALL))
    large = scale.measure(op, LARGE, _rank(op, who, LARGE))
    assert {k: large.get(k, 0) for k in CALLS} == {k: small.get(k, 0) for k in CALLS}
    # bytes: what a rank moves and reads may shrink as its shard does, never grow
    assert large["collective_bytes"] <= small["collective_bytes"] + 64
    assert large["bytes_read"] <= small["bytes_read"] * 1.05 + 4096


def test_a_rank_waits_for_a_commit_through_the_store_not_the_file_system():
    """The commit as a rank other than 0 sees it: its write counted, rank 0's key checked;
    rank 0's look every step while a checkpoint is written: one counter, no marker."""
    other = scale.measure("commit", LARGE, scale.playing_rank("commit", LARGE))
    watch = scale.measure("commit_watch", LARGE, 0)
    for counts in (other, watch):
        assert counts.get("fs_stats", 0) == counts.get("fs_listings", 0) == 0, counts
        assert counts["store_ops"] > 0, counts


def test_only_rank_0_does_work_that_grows_with_the_world_and_once_per_checkpoint():
    small, large = scale.measure("commit", SMALL, 0), scale.measure("commit", LARGE, 0)
    ratio = LARGE / SMALL
    for key in ("fs_stats", "fs_opens"):  # every rank's marker and shard, once
        assert ratio * 0.8 <= large[key] / small[key] <= ratio * 1.2, (key, small, large)
    assert large["store_ops"] == small["store_ops"] > 0  # the counter, the commit key


def test_a_failed_measurement_reports_its_cause():
    cause = r"(?s)unknown at N=32 rank 1 failed.*KeyError: 'op_unknown'"
    with pytest.raises(RuntimeError, match=cause):
        scale.measure("unknown", SMALL, 1)
