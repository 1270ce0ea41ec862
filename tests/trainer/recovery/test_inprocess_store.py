"""The in-process Wrapper's store (`trainer.recovery.inprocess.wrapper_store`) with NVRx's real
Wrapper monitor: the monitor never outlives a rank whose job was killed, and ranks still meet
in it. Real processes, real NVRx (0.4.1 here, 0.7 in the image leg)."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.jobs import ROOT, env_for
from trainer.lifetime import process_start

pytestmark = pytest.mark.slow  # real NVRx monitors

BOUND_S = 120  # how long a test waits for a process to go before it fails
STORE_TIMEOUT_S = 600  # a store's own timeout: what a monitor left waiting on it would wait

# A rank that starts NVRx's monitor and dies right after telling it the store exists: the
# instant in which a killed job takes the store's host (rank 0) with it.
RANK = """
import datetime, inspect, os, sys
sys.path.insert(0, sys.argv[1])
from nvidia_resiliency_ext.inprocess.monitor_process import MonitorProcess
from trainer.recovery.inprocess import wrapper_store
factory, kwargs = wrapper_store(int(sys.argv[3]), float(sys.argv[4]))
s = lambda x: datetime.timedelta(seconds=x)
given = dict(rank=int(os.environ["RANK"]), world_size=2, soft_timeout=s(60), hard_timeout=s(90),
             termination_grace_time=s(1), barrier_timeout=s(60), interval=s(0.1),
             heartbeat_interval=s(1), heartbeat_timeout=s(30), log_filename=None,
             pid_filename=None, store_factory=factory, store_kwargs=kwargs)
names = inspect.signature(MonitorProcess.__init__).parameters
monitor = MonitorProcess(**{k: v for k, v in given.items() if k in names})
open(sys.argv[2], "w").write(str(monitor.process_monitor_proc.pid))
monitor.can_create_store()
os._exit(0)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path, rank: int) -> dict:
    return {**env_for(tmp_path), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}


@pytest.mark.parametrize("rank", [0, 1])
def test_a_monitor_whose_rank_died_with_the_stores_host_ends(tmp_path, rank):
    """NVRx's own TCPStore left rank 0's monitor hosting a new store on the freed port, waiting
    for ranks that were gone, and rank 1's retrying its connection, each for the store's whole
    timeout."""
    out = tmp_path / "monitor.pid"
    proc = subprocess.run([sys.executable, "-c", RANK, str(ROOT), str(out), str(_free_port()),
                           str(STORE_TIMEOUT_S)], env=_env(tmp_path, rank), cwd=ROOT,
                          capture_output=True, text=True, timeout=BOUND_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    monitor = int(out.read_text())
    deadline = time.monotonic() + BOUND_S
    try:
        while process_start(monitor) is not None:
            assert time.monotonic() < deadline, "the monitor outlived its rank"
            time.sleep(0.1)
    finally:
        if process_start(monitor) is not None:
            os.kill(monitor, signal.SIGKILL)


RANKS_MEET = """
import os, sys
sys.path.insert(0, sys.argv[1])
from trainer.recovery.inprocess import wrapper_store
factory, kwargs = wrapper_store(int(sys.argv[2]), 60.0)
store = factory(**kwargs)
store.set(f"rank{os.environ['RANK']}", "here")
store.wait([f"rank{r}" for r in range(2)])
print(sorted(store.critical_ranks))
"""


def test_both_ranks_meet_in_the_store_rank_0_hosts(tmp_path):
    port = _free_port()
    env = _env(tmp_path, 0)
    ranks = [subprocess.Popen([sys.executable, "-c", RANKS_MEET, str(ROOT), str(port)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    for r in ranks:
        stdout, stderr = r.communicate(timeout=BOUND_S)
        assert r.returncode == 0, stderr[-3000:]
        assert stdout.strip() == "[0]"
