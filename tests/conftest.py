"""Fixtures shared by the suite: the prepared corpus, this machine's pace, fault-free reference
runs, a one-rank group; and pytest-timeout's bound per test, stretched with the pace."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable

import pytest

from bench.scale import SHARD_CACHE_ENV
from devtools.pace import Pace
from tests import jobs
from tests.jobs import INTERVAL, STEPS, ok, results, run_local


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item):
    """Once a job has measured the pace, each test's bound (the `timeout` setting) follows it too,
    as the bounds on its jobs do (`tests.jobs.stretched`)."""
    fast = float(item.config.getini("timeout") or 0)
    if fast and item.get_closest_marker("timeout") is None:
        item.add_marker(pytest.mark.timeout(jobs.stretched(fast)))
    yield


@pytest.fixture(scope="session", autouse=True)
def scale_shards(tmp_path_factory):
    """bench.scale's measurements save each shard once per run of the suite, shared by its
    workers (their base folders' parent is this run's)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "scale-shards"
    root.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SHARD_CACHE_ENV, str(root))
        yield root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """Keeps the prepared local corpus out of the user's home, shared by all tests."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def pace(cache_dir) -> Pace:
    """This machine's pace, measured once (`tests.jobs.pace`): recovery timeouts and runner flags
    for the tests' jobs."""
    return jobs.pace(cache_dir)


@pytest.fixture(scope="session")
def reference(cache_dir, tmp_path_factory) -> Callable[..., dict]:
    """Fault-free results per (steps, nproc), computed once: the param_sha256 to match."""
    memo: dict[tuple, dict] = {}

    def get(steps: int = STEPS, nproc: int = 2, extra: tuple[str, ...] = ()) -> dict:
        key = (steps, nproc, extra)
        if key not in memo:
            run_dir = tmp_path_factory.mktemp("reference")
            ok(run_local(cache_dir, "baseline", run_dir, "--max_steps", str(steps),
                         "--checkpoint_interval", str(INTERVAL), "--trace_samples", "true",
                         *extra, nproc=nproc))
            memo[key] = {**results(run_dir), "run_dir": run_dir}
        return memo[key]

    return get


@pytest.fixture(scope="module")
def one_rank_group():
    """A one-rank gloo process group in this process, for model and FSDP tests."""
    import torch
    import torch.distributed as dist

    from trainer.distributed import DistEnv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield DistEnv(0, 1, 0, 1, torch.device("cpu"))
    dist.destroy_process_group()


def pytest_collection_modifyitems(items) -> None:
    """`slow`: a test that runs real training jobs (it asks for the prepared corpus or a
    reference run). `make test-fast` leaves these out, and those marked `slow` by their module
    (real linters, real FSDP builds, real launchers)."""
    for item in items:
        if {"cache_dir", "reference"} & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
