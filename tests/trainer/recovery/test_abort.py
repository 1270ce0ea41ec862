"""The in-process abort (`trainer.recovery.abort`): torch's registry emptied at once, the old
groups shut down on a thread of their own, a new group usable before that thread ends."""

import threading

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from trainer.recovery import abort


def test_the_registry_names_it_clears_exist_in_this_torch():
    """What `forget_process_groups` clears by hand: fails when torch renames any of it."""
    for name in ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag",
                 "tags_to_pg", "pg_coalesce_state", "group_count"):
        assert hasattr(c10d._world, name), name
    assert callable(c10d._update_default_pg) and callable(c10d._unregister_all_process_groups)


@pytest.fixture
def group():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    abort.join_pending(30)
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_new_group_works_while_the_old_one_shuts_down(group, monkeypatch):
    dist.new_group([0])  # a second group: both are shut down, newest first
    old = list(c10d._world.pg_names)
    release, shut = threading.Event(), []

    def slow_shutdown(self):  # the old groups' shutdown held until the new group has run
        assert release.wait(30)
        shut.append(self)

    monkeypatch.setattr(dist.ProcessGroup, "shutdown", slow_shutdown)
    done = []
    abort.abort_process_groups(done=done.append)
    assert not dist.is_initialized() and not c10d._world.pg_map  # at once, not after shutdown
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    x = torch.ones(3)
    dist.all_reduce(x)
    assert x.tolist() == [1.0, 1.0, 1.0] and not shut
    assert not abort.join_pending(0.05)  # still shutting down
    release.set()
    assert abort.join_pending(30)
    assert shut == sorted(old, key=lambda g: old.index(g), reverse=True) and len(done) == 1
    assert all(t.name != "nccl-abort" for t in threading.enumerate())


def test_without_a_group_nothing_runs():
    assert not dist.is_initialized()
    abort.abort_process_groups(done=lambda s: pytest.fail("no group, no abort"))
    assert abort.join_pending(0)
