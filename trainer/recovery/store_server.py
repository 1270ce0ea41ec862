"""`python -m trainer.recovery.store_server --master_port P`: every store of a run, in a process of
its own, so that no training node is special.

A run's launchers and ranks meet in stores: the launchers' rendezvous (ft_launcher's c10d
TCPStore, port P), the in-process Wrapper's store (P+1) and the trainer's application store
(P+2), ports from `config.contract`; the default process group's store and the fail-fast and
liveness keys live under prefixes of P's store (`trainer.recovery.stores`). Without this process
the launcher of node 0 hosts the rendezvous and rank 0 the others, so the loss of that one node
fails every pod and takes the rendezvous with it. Here they live in a small process (a pod
of its own on the cluster, a process beside the simulated nodes locally) that holds no training
state; the launchers run with `--external_store` and host nothing.

This process's own loss ends the job cleanly: every launcher's next rendezvous or store call
fails to connect, the launchers exit with a failure, and the Job restarts the run from its
newest checkpoint (what survives in the node tier is read again). It logs one line once every
port accepts connections and exits 0 on SIGTERM (a pod's stop) or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import timedelta
from typing import Optional, Sequence

from config.contract import DEFAULT_MASTER_PORT, app_store_port, wrapper_store_port

PROG = "python -m trainer.recovery.store_server"


def store_ports(master_port: int) -> list[int]:
    """Every port a run's stores listen on, from the launchers' --master_port."""
    return [master_port, wrapper_store_port(master_port), app_store_port(master_port)]


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--master_port", type=int, default=DEFAULT_MASTER_PORT,
                   help="the launchers' --master_port; the stores listen on it and the ports "
                        "config.contract derives from it")
    p.add_argument("--host", default="0.0.0.0",
                   help="the address the stores listen on (default: every interface)")
    a = p.parse_args(argv)
    top = max(store_ports(a.master_port))
    if not 0 < a.master_port or top > 65535:
        p.error(f"--master_port {a.master_port} must leave room for the run's ports "
                f"{', '.join(map(str, store_ports(a.master_port)))}: use 1 to {65535 - top + a.master_port}")
    return a


def serve(host: str, master_port: int) -> list:
    """Start one TCPStore server on each of the run's ports; they serve from threads of this
    process until it exits."""
    import torch.distributed as dist

    return [dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30), multi_tenant=True)
            for port in store_ports(master_port)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        stores = serve(a.host, a.master_port)
    except Exception as exc:  # noqa: BLE001 - a port in use, an address not ours: one line
        print(f"{PROG}: error: --master_port {a.master_port}: cannot serve the run's stores "
              f"on {a.host}: {exc}".splitlines()[0], file=sys.stderr, flush=True)
        return 2
    ports = ", ".join(map(str, store_ports(a.master_port)))
    print(f"{PROG}: serving the run's stores on {a.host} ports {ports}", flush=True)
    while not stop.wait(1.0):
        pass
    del stores
    print(f"{PROG}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
