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


@pytest.mark.parametrize("op", [op for op in scale.OPERATIONS if op != "commit"])
def test_a_rank_does_the_same_work_in_a_world_sixteen_times_larger(op):
    small = scale.measure(op, SMALL, scale.playing_rank(op, SMALL))
    large = scale.measure(op, LARGE, scale.playing_rank(op, LARGE))
    assert {k: large.get(k, 0) for k in CALLS} == {k: small.get(k, 0) for k in CALLS}
    # bytes: what a rank moves and reads may shrink as its shard does, never grow
    assert large["collective_bytes"] <= small["collective_bytes"] + 64
    assert large["bytes_read"] <= small["bytes_read"] * 1.05 + 4096


def test_only_rank_0_does_work_that_grows_with_the_world_and_once_per_checkpoint():
    small, large = scale.measure("commit", SMALL, 0), scale.measure("commit", LARGE, 0)
    ratio = LARGE / SMALL
    for key in ("fs_stats", "fs_opens"):  # every rank's marker and shard, once
        assert ratio * 0.8 <= large[key] / small[key] <= ratio * 1.2, (key, small, large)
    assert large.get("store_ops", 0) == small.get("store_ops", 0) == 0
