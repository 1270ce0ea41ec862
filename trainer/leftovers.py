"""What an in-process attempt leaves behind: nothing, once the next attempt starts.

An in-process restart keeps the process, so anything that still references the failed
attempt's model, optimizer or loop keeps their device memory: each restart would hold one more
copy until the run runs out of memory. `Attempt` keeps weak references to those objects; the
next attempt asks, after a full collection, which are still alive, and records them with the
device memory it starts from (`start_clean`), so a leak shows in the event log at the first
restart instead of as an out-of-memory error dozens of faults later.

Memory no object holds can stay reserved too. FSDP2 allocates gathered parameters and reduced
gradients on CUDA streams of its own, made anew with each model, and torch's caching allocator
keeps a freed block for the stream it was allocated on: the blocks of the failed attempt's
streams can serve no allocation again. One rank of llama-1b on an H200 reserved 4.6 GiB more
at each restart, about 4 bytes a parameter: the size of its reduced fp32 gradients. So those
blocks are returned to the device before the next attempt builds its model.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Optional

import torch


class Attempt:
    """Weak references to one attempt's large state, by name."""

    def __init__(self) -> None:
        self._refs: dict[str, weakref.ref] = {}

    def track(self, **objects: object) -> None:
        for name, obj in objects.items():
            if obj is not None:
                self._refs[name] = weakref.ref(obj)

    def alive(self) -> list[str]:
        """The tracked objects still reachable after a full collection, by name."""
        if not self._refs:
            return []
        gc.collect()
        return sorted(name for name, ref in self._refs.items() if ref() is not None)


def memory_now(device: torch.device) -> Optional[dict[str, float]]:
    """The caching allocator's allocated and reserved device memory now, GiB; None off CUDA."""
    if device.type != "cuda":
        return None
    return {"allocated_gib": round(torch.cuda.memory_allocated(device) / 2**30, 3),
            "reserved_gib": round(torch.cuda.memory_reserved(device) / 2**30, 3)}


def start_clean(previous: Attempt, device: torch.device) -> dict:
    """Before an in-process attempt builds: what of the previous one is alive, and the device
    memory before and after the cached blocks no live stream can use are released."""
    alive = previous.alive()
    threads = sorted(t.name for t in threading.enumerate())
    before = memory_now(device)
    t0 = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return {"alive": alive, "threads": threads, "memory_before": before, "device_memory": memory_now(device),
            "release_s": round(time.perf_counter() - t0, 4)}
