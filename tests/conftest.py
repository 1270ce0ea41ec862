"""Fixtures shared by the suite: the prepared corpus, this machine's pace, fault-free reference
runs, a one-rank group; and pytest-timeout's bound per test, stretched with the pace."""

from __future__ import annotations

import fcntl
import os
import shutil
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


def run_wide(tmp_path_factory, name: str) -> Path:
    """A folder shared by every worker of this pytest run (their base folders' parent)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / name
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session", autouse=True)
def scale_shards(tmp_path_factory):
    """bench.scale's measurements save each shard once per run of the suite, shared by its
    workers."""
    root = run_wide(tmp_path_factory, "scale-shards")
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
    """Fault-free results per (steps, nproc, extra): the param_sha256 to match. Each is trained
    once per run of the suite, by whichever worker asks first (the others wait for it, under a
    lock), and only read after that."""
    root = run_wide(tmp_path_factory, "references")

    def get(steps: int = STEPS, nproc: int = 2, extra: tuple[str, ...] = ()) -> dict:
        run_dir = root / "-".join(map(str, (steps, nproc, *extra))).replace("/", "_")
        with open(root / f"{run_dir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = root / f"{run_dir.name}.done"
            if not done.exists():
                shutil.rmtree(run_dir, ignore_errors=True)  # a worker's run that failed
                ok(run_local(cache_dir, "baseline", run_dir, "--max_steps", str(steps),
                             "--checkpoint_interval", str(INTERVAL), "--trace_samples", "true",
                             *extra, nproc=nproc))
                done.touch()
        return {**results(run_dir), "run_dir": run_dir}

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
