"""The ranks' watch of their neighbour node (NVRx 0.6+, where the rendezvous keeps no
keep-alive): beats and judgements on a real store, with the clock passed in."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from devtools.local import free_port_block
from trainer.recovery import nodewatch
from trainer.recovery.nodewatch import Watch, neighbour


@pytest.fixture()
def store():
    port = free_port_block()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    yield lambda: dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                timeout=timedelta(seconds=10))
    del server


ROUND = {"TORCHELASTIC_RUN_ID": "r", "NVRX_EKS_RDZV_ROUND": "3"}


def test_each_node_watches_one_other_in_a_ring():
    assert [neighbour(n, 4) for n in range(4)] == [1, 2, 3, 0]
    assert {neighbour(n, 1000) for n in range(1000)} == set(range(1000))


def test_a_neighbour_that_stops_beating_is_silent_after_the_timeout(store):
    a, b = Watch(store(), 0, 2, 6.0, ROUND), Watch(store(), 1, 2, 6.0, ROUND)
    for t in range(0, 12, 2):  # both beat: nobody is silent
        assert a.tick(float(t)) is None and b.tick(float(t)) is None
    # node 1 beats last at t=10; node 0 sees that beat at t=12 and judges node 1 once more
    # than 6 s pass from there without a move
    assert [a.tick(float(t)) for t in (12, 14, 16, 18)] == [None, None, None, None]
    assert a.tick(19.0) == pytest.approx(7.0)


def test_a_neighbour_is_judged_only_after_its_first_beat(store):
    a = Watch(store(), 0, 2, 6.0, ROUND)
    assert all(a.tick(float(t)) is None for t in range(0, 100, 10))  # node 1 never started


def test_another_round_starts_from_nothing(store):
    old = Watch(store(), 1, 2, 6.0, ROUND)
    old.tick(0.0)  # node 1 beat in round 3; node 0 of round 4 must not read it
    new = Watch(store(), 0, 2, 6.0, {**ROUND, "NVRX_EKS_RDZV_ROUND": "4"})
    assert all(new.tick(float(t)) is None for t in range(0, 60, 5))


def test_nothing_starts_without_the_launchers_timeout_the_store_or_a_second_node():
    base = {**ROUND, "NVRX_EKS_STORE": "127.0.0.1:1", nodewatch.NODE_TIMEOUT_ENV: "6"}
    never = lambda node, s: pytest.fail("judged")  # noqa: E731
    assert nodewatch.start(0, 1, never, base) is None
    assert nodewatch.start(0, 2, never, {**base, nodewatch.NODE_TIMEOUT_ENV: ""}) is None
    assert nodewatch.start(0, 2, never, {k: v for k, v in base.items()
                                         if k != "NVRX_EKS_STORE"}) is None


def test_the_launcher_asks_for_the_watch_only_where_the_rendezvous_cannot_find_a_silent_node(
        monkeypatch):
    from trainer import nvrx_compat
    from trainer.recovery.launch import LaunchSpec, launch_env

    cfg = type("Cfg", (), {"output_dir": None, "collective_timeout": lambda self, d: 60.0,
                           "hard_timeout": 60.0})()
    spec = LaunchSpec("ft_launcher", 2, 1, 0, "store", 29500, spare_nodes=1,
                      external_store=True, node_timeout=9)
    for release, watched in (((0, 4), False), ((0, 7), True)):
        monkeypatch.setattr(nvrx_compat, "NVRX_VERSION", release)
        env = launch_env(spec, cfg, base={})
        assert env.get(nodewatch.NODE_TIMEOUT_ENV) == ("9" if watched else None)
    no_store = LaunchSpec("ft_launcher", 2, 1, 0, "node-0", 29500)
    assert nodewatch.NODE_TIMEOUT_ENV not in launch_env(no_store, cfg, base={})


def test_the_round_a_worker_group_joined_is_read_from_either_rendezvous():
    from trainer.nvrx_compat import joined_round

    c10d = type("H", (), {"_state_holder": type("S", (), {"state": type("St", (), {"round": 5})()})()})()
    barrier = type("H", (), {"round": lambda self: 7})()
    neither = type("H", (), {"round": lambda self: (_ for _ in ()).throw(NotImplementedError())})()
    assert (joined_round(c10d), joined_round(barrier), joined_round(neither)) == (5, 7, None)
