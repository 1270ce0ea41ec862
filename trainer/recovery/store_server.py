"""`python -m trainer.recovery.store_server --master_port P --nnodes N ...`: every store of a run,
in a process of its own, so that no training node is special.

A run's launchers and ranks meet in stores: the launchers' rendezvous (ft_launcher's c10d
TCPStore, port P), the in-process Wrapper's store (P+1) and the trainer's application store
(P+2), ports from `config.contract`; the default process group's store and the fail-fast and
liveness keys live under prefixes of P's store (`trainer.recovery.stores`). Without this process
the launcher of node 0 hosts the rendezvous and rank 0 the others, so the loss of that one node
fails every pod and takes the rendezvous with it. Here they live in a small process (a pod
of its own on the cluster, a process beside the simulated nodes locally) that holds no training
state; the launchers run with `--external_store` and host nothing.

It takes the launchers' rendezvous flags (`launch.add_rendezvous_args`): from NVRx 0.6 the
store's host closes each rendezvous round, so NVRx's closer serves port P here with the same
node range and round settings (`nvrx_compat.rendezvous_closer`).

This process's own loss ends the job cleanly: every launcher's next rendezvous or store call
fails to connect, the launchers exit with a failure, and the Job restarts the run from its
newest checkpoint (what survives in the node tier is read again). It logs one line once every
port accepts connections and exits 0 on SIGTERM (a pod's stop) or SIGINT; it ends with its
round closer, whose exit code it returns (0 once the launchers have closed the rendezvous).
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Optional, Sequence

from config.contract import DEFAULT_MASTER_PORT, app_store_port, wrapper_store_port
from trainer.lifetime import child_dies_with_me

PROG = "python -m trainer.recovery.store_server"
CLOSER_START_S = 120.0  # NVRx's closer imports torch before it listens


def store_ports(master_port: int) -> list[int]:
    """Every port a run's stores listen on, from the launchers' --master_port."""
    return [master_port, wrapper_store_port(master_port), app_store_port(master_port)]


def parse(argv: Sequence[str]) -> argparse.Namespace:
    from trainer.recovery.launch import add_rendezvous_args, rendezvous_problem

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--master_port", type=int, default=DEFAULT_MASTER_PORT,
                   help="the launchers' --master_port; the stores listen on it and the ports "
                        "config.contract derives from it")
    p.add_argument("--host", default="0.0.0.0",
                   help="the address the stores listen on (default: every interface)")
    add_rendezvous_args(p)
    a = p.parse_args(argv)
    top = max(store_ports(a.master_port))
    if not 0 < a.master_port or top > 65535:
        p.error(f"--master_port {a.master_port} must leave room for the run's ports "
                f"{', '.join(map(str, store_ports(a.master_port)))}: use 1 to {65535 - top + a.master_port}")
    problem = rendezvous_problem(a)
    if problem:
        p.error(problem)
    return a


def closer_argv(a: argparse.Namespace) -> Optional[list[str]]:
    """The round closer for the launchers' rendezvous (None: a plain store serves it)."""
    from trainer.recovery.launch import LaunchSpec, rendezvous_flags
    from trainer.nvrx_compat import rendezvous_closer

    spec = LaunchSpec("ft_launcher", a.nnodes, 1, 0, a.host, a.master_port, rdzv_id=a.rdzv_id,
                      rdzv_join_timeout=a.rdzv_join_timeout, min_nodes=a.min_nodes,
                      spare_nodes=a.spare_nodes, external_store=True, node_timeout=a.node_timeout,
                      rdzv_last_call_timeout=a.rdzv_last_call_timeout)
    return rendezvous_closer(rendezvous_flags(spec))


def serve(host: str, ports: Sequence[int]) -> list:
    """Start one TCPStore server on each of `ports`; they serve from threads of this process
    until it exits."""
    import torch.distributed as dist

    return [dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30), multi_tenant=True)
            for port in ports]


def listening(host: str, port: int, timeout_s: float, proc: Optional[subprocess.Popen]) -> bool:
    """Whether `port` on `host` accepts connections within `timeout_s` (False at once if
    `proc`, which should serve it, has exited)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return True
        time.sleep(0.1)
    return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    closer_cmd = closer_argv(a)
    ports = store_ports(a.master_port)
    try:
        stores = serve(a.host, ports[1:] if closer_cmd else ports)
    except Exception as exc:  # noqa: BLE001 - a port in use, an address not ours: one line
        print(f"{PROG}: error: --master_port {a.master_port}: cannot serve the run's stores "
              f"on {a.host}: {exc}".splitlines()[0], file=sys.stderr, flush=True)
        return 2
    closer = None
    if closer_cmd:
        closer = subprocess.Popen(closer_cmd, preexec_fn=child_dies_with_me())
        if not listening(a.host, a.master_port, CLOSER_START_S, closer):
            closer.kill()
            print(f"{PROG}: error: the rendezvous closer did not serve port {a.master_port} "
                  f"(exit {closer.wait()}); its log is above", file=sys.stderr, flush=True)
            return 1
    what = "; NVRx's closer serves the rendezvous" if closer else ""
    print(f"{PROG}: serving the run's stores on {a.host} ports "
          f"{', '.join(map(str, ports))}{what}", flush=True)
    code = 0
    while not stop.wait(1.0):
        if closer is not None and closer.poll() is not None:
            code = closer.returncode
            print(f"{PROG}: the rendezvous closer exited with {code}", flush=True)
            break
    if closer is not None and closer.poll() is None:
        closer.terminate()
        closer.wait()
    del stores
    print(f"{PROG}: stopped", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
