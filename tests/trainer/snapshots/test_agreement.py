"""The restore agreement's pure parts: which files a rank serves, what it publishes and finds in
the store, and the choice of step from fixed-size votes."""

from __future__ import annotations

import json

import torch.distributed as dist

from trainer.atomic import write_json_atomic
from trainer.snapshots import agreement
from trainer.snapshots.agreement import CANDIDATES, Held
from trainer.snapshots.slot import own_files, replica_files


def _snapshot(files, rank: int, step: int, world: int = 4, size: int = 64) -> None:
    buf, header = files
    buf.write_bytes(b"\0" * size)
    write_json_atomic(header, {"step": step, "rank": rank, "world_size": world, "meta": {"step": step},
                               "layout": {"total_bytes": size, "fields": []}})


def test_each_file_of_a_node_is_served_by_the_local_rank_of_its_shard(tmp_path):
    # a node of two ranks (2, 3) in a world of 4: own slots of 2 and 3, replicas of 0 and 1
    _snapshot(own_files(tmp_path, 2, 0), 2, 7)
    _snapshot(own_files(tmp_path, 3, 0), 3, 7)
    _snapshot(replica_files(tmp_path, 0, 0), 0, 6)
    _snapshot(replica_files(tmp_path, 1, 1), 1, 6)
    _snapshot(own_files(tmp_path, 3, 1), 3, 5, world=8)  # another world: not offered
    even = agreement.served(tmp_path, 2, local_world_size=2, world_size=4)
    odd = agreement.served(tmp_path, 3, local_world_size=2, world_size=4)
    assert sorted(even) == [0, 2] and sorted(odd) == [1, 3]
    assert [h for h, _ in even[0]] == [Held(6, 2, True, 64)]
    assert [h for h, _ in odd[3]] == [Held(7, 3, False, 64)]


def test_a_rank_finds_its_shard_whoever_serves_it_and_prefers_its_own_slot(tmp_path):
    store = dist.HashStore()
    agreement.publish(store, "p", {5: [(Held(10, 5, False, 64), tmp_path), (Held(9, 5, False, 64), tmp_path)]})
    agreement.publish(store, "p", {5: [(Held(10, 9, True, 64), tmp_path), (Held(8, 9, True, 64), tmp_path)]})
    found = agreement.lookup(store, "p", 5)
    assert found == {10: Held(10, 5, False, 64), 9: Held(9, 5, False, 64), 8: Held(8, 9, True, 64)}
    assert agreement.lookup(store, "p", 6) == {}
    assert json.loads(store.get("p/5/own")) == [[10, 5, 64], [9, 5, 64]]


def test_the_vote_is_fixed_size_and_takes_the_newest_step_everyone_has():
    proposal = agreement.candidate_vector([3, 12, 7, 12, 9])
    assert proposal == [12, 9, 7, 3] + [-1] * (CANDIDATES - 4)
    assert len(agreement.candidate_vector(list(range(100)))) == CANDIDATES
    votes = [agreement.mask(proposal, have) for have in ({12, 9, 3}, {9, 7, 3}, {12, 9})]
    agreed = [min(col) for col in zip(*votes)]  # what the MIN all-reduce computes
    assert agreement.pick(proposal, agreed) == 9
    assert agreement.pick(proposal, agreement.mask(proposal, set())) is None
    assert agreement.mask(proposal, {-1}) == [0] * CANDIDATES  # padding is never a step
