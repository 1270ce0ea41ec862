"""When a durable checkpoint may be committed, told through the process group's store.

The shared file system holds the verified record (each rank's marker, then the manifest), but
watching it for progress costs a metadata server O(N) stats per look. Instead, the store carries
two small keys per checkpoint, in a namespace of the attempt that wrote it:

    nvrx-eks/durable/<attempt>/<step>/landed     each rank adds 1 once its shard and marker
                                                 are durable (its writer process does, so a
                                                 frozen training thread cannot hold it back)
    nvrx-eks/durable/<attempt>/<step>/committed  set by rank 0 once the manifest is published

Rank 0 reads one counter per look and the N markers once it reaches N; every other rank checks
one key while it waits for the commit. The attempt number comes from a counter rank 0 bumps
before a barrier, so a count left by an earlier attempt (a launcher's store outlives its
workers) can never be mistaken for this one's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional

import torch.distributed as dist

from trainer.distributed import default_group_store

ATTEMPTS_KEY = "nvrx-eks/durable/attempts"
WAIT_FIRST_S = 0.01  # a commit waited for is checked this soon, then ever less often
WAIT_MAX_S = 1.0     # at most this far apart: one store operation per rank and second
CONNECT_S = 60.0     # how long a writer process may take to reach the store


@dataclass(frozen=True)
class StoreAddress:
    """A TCPStore by address: what a writer process (which cannot be handed a store object)
    needs to reach the same keys."""

    host: str
    port: int

    def add(self, key: str, n: int) -> int:
        return _client(self).add(key, n)


_CLIENTS: dict[StoreAddress, dist.Store] = {}


def _client(address: StoreAddress) -> dist.Store:
    """One connection per writer process and store, opened by its first write."""
    if address not in _CLIENTS:
        _CLIENTS[address] = dist.TCPStore(address.host, address.port, is_master=False,
                                          wait_for_workers=False,
                                          timeout=timedelta(seconds=CONNECT_S))
    return _CLIENTS[address]


def base_store(store: dist.Store) -> dist.Store:
    """The store under every prefix: keys set there are the same for any process that
    connects to it, whatever prefixes its process group added."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def address_of(store: dist.Store) -> Optional[StoreAddress]:
    """Where another process reaches `store`; None for a store that lives in this process."""
    if isinstance(store, dist.TCPStore):
        return StoreAddress(store.host, store.port)
    return None


@dataclass(frozen=True)
class Landed:
    """One checkpoint's counter, by address where there is one: small enough to pickle into
    the write request."""

    key: str
    address: Optional[StoreAddress]

    def signal(self) -> None:
        """From the writer process: this rank's shard and marker are durable."""
        if self.address is not None:
            self.address.add(self.key, 1)


class Landings:
    """One attempt's commit keys in the store."""

    def __init__(self, store: dist.Store, prefix: str):
        self.store, self.prefix = store, prefix
        self.address = address_of(store)

    @staticmethod
    def join(rank: int) -> "Landings":
        """Every rank, collectively, once per attempt: the attempt's own namespace."""
        store = base_store(default_group_store())
        if rank == 0:
            store.add(ATTEMPTS_KEY, 1)
        dist.barrier()
        return Landings(store, f"nvrx-eks/durable/{store.add(ATTEMPTS_KEY, 0)}")

    def landed(self, step: int) -> Landed:
        return Landed(f"{self.prefix}/{step}/landed", self.address)

    def signals_itself(self) -> bool:
        """Whether a writer process adds to the counter itself (else the training thread does,
        once it sees the write returned)."""
        return self.address is not None

    def add_landed(self, step: int) -> None:
        self.store.add(self.landed(step).key, 1)

    def count(self, step: int) -> int:
        """How many ranks' shards of `step` are durable: one store operation."""
        return self.store.add(self.landed(step).key, 0)

    def mark_committed(self, step: int) -> None:
        self.store.set(f"{self.prefix}/{step}/committed", "1")

    def wait_committed(self, step: int, timeout_s: float, keepalive: Callable[[], None]) -> bool:
        """Wait for rank 0's commit of `step`, checking one key ever less often (WAIT_MAX_S at
        most), keepalive between; False once `timeout_s` has passed. A check, not the store's
        own wait: a TCPStore client whose wait timed out does not answer reliably after it."""
        key = f"{self.prefix}/{step}/committed"
        deadline, pause = time.monotonic() + timeout_s, WAIT_FIRST_S
        while not self.store.check([key]):
            if time.monotonic() > deadline:
                return False
            keepalive()
            time.sleep(pause)
            pause = min(pause * 2, WAIT_MAX_S)
        return True
