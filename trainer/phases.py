"""Set-up and tear-down phases: bounded on their own, invisible to the training-progress timeouts.

NVRx's soft and hard timeouts and ft_launcher's heartbeats watch the training loop. Start-up
(model build, buffer mapping, pinning and pre-touch, restore), checkpoint drains and the final
save are long calls into C: run on the main thread they starve NVRx's progress stamps (which run
only between the main thread's Python bytecodes), and a healthy rank is restarted, again and
again. A phase runs that work on a helper thread while the main thread keeps stamping and
heartbeating; the phase's own bound ends it with a clear error instead. An attempt's first step
(lazy set-up, compilation) is bounded the same way but runs on the main thread while the helper
keeps the stamps going (`run_here`): the loop's later steps reuse what it caches there.

The main thread stays interruptible throughout, so a peer's fault still restarts this rank at
once. An interrupted phase's thread is waited for before the next attempt forms its process
group (`join_interrupted`), so re-entry never races the work of the attempt it replaces.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Optional, TypeVar

import torch

T = TypeVar("T")

# Test hook: seconds added to phases, "startup=8,first_step=8,commit=8,write=2", and to every
# step, "step=0.1" (the host idle while a device computes: the CPU ranks' steps last as long as
# a GPU's would, at no CPU cost).
SLOW_PHASE_ENV = "NVRX_EKS_SLOW_PHASE"
_POLL_S = 0.05

_running: Optional[threading.Thread] = None  # the phase thread of this process, if any
_beating: Optional[threading.Event] = None  # stops run_here's keepalive helper


class PhaseTimeout(RuntimeError):
    """A phase outlasted its bound. No restart can fix it: the job ends with this message."""


def injected_delay(name: str) -> float:
    """Seconds the test hook adds to phase (or background step) `name`."""
    for part in os.environ.get(SLOW_PHASE_ENV, "").split(","):
        key, _, seconds = part.partition("=")
        if key.strip() == name:
            return float(seconds)
    return 0.0


def join_interrupted(bound_s: float, keepalive: Callable[[], None]) -> None:
    """Wait for an interrupted attempt's phase thread: two threads must never build one state,
    and a thread still inside a collective of the aborted process group must leave it (NCCL:
    at once; gloo: at its timeout) before the next group is formed."""
    global _running
    if _beating is not None:  # a restart that hit run_here's `finally` early: no stale keepalives
        _beating.set()
    previous = _running
    deadline = time.monotonic() + bound_s
    while previous is not None and previous.is_alive():
        if time.monotonic() > deadline:
            raise PhaseTimeout(f"the interrupted attempt's {previous.name} phase did not end "
                               f"within {bound_s:g} s")
        previous.join(_POLL_S)
        keepalive()
    _running = None


def run_phase(name: str, fn: Callable[[], T], bound_s: float, keepalive: Callable[[], None],
              device: Optional[torch.device] = None) -> T:
    """Run `fn` on a helper thread; the main thread waits in Python, calling `keepalive`.

    Raises `PhaseTimeout` naming the phase once it has run `bound_s` seconds, and re-raises
    whatever `fn` raised.
    """
    global _running
    join_interrupted(bound_s, keepalive)
    box: dict = {}

    def target() -> None:
        try:
            if device is not None and device.type == "cuda":
                torch.cuda.set_device(device)  # the current device is per thread
            delay = injected_delay(name)
            if delay:
                time.sleep(delay)
            box["value"] = fn()
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    _running = thread
    started = time.monotonic()
    thread.start()
    while thread.is_alive():
        thread.join(_POLL_S)
        keepalive()
        if time.monotonic() - started > bound_s and thread.is_alive():
            raise PhaseTimeout(f"the {name} phase took more than {bound_s:g} s; "
                               "it is not retried")
    _running = None
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_here(name: str, fn: Callable[[], T], bound_s: float, keepalive: Callable[[], None]) -> T:
    """Run `fn` on this thread while a helper thread calls `keepalive`, until `bound_s`.

    For an attempt's first step. DTensor caches its sharding propagation per thread: a first
    step on a phase's thread paid that again after every in-process restart (0.75 s against
    0.29 s for llama-1b on an H200), and in a new process the loop's second step paid it once
    more. A step runs Python throughout (FSDP's hooks, DTensor's dispatch, compilation), so
    NVRx's automatic progress stamps go on; the helper sends the manual ones and ft_launcher's
    heartbeats. Past the bound the helper stops, and a step that never returns is then a hang
    for the progress timeouts; one that returns late raises `PhaseTimeout`.
    """
    global _beating
    join_interrupted(bound_s, keepalive)
    started = time.monotonic()
    stop = _beating = threading.Event()

    def beat() -> None:
        while not stop.wait(_POLL_S) and time.monotonic() - started < bound_s:
            keepalive()

    helper = threading.Thread(target=beat, name=f"{name}-keepalive", daemon=True)
    helper.start()
    try:
        delay = injected_delay(name)
        while time.monotonic() - started < delay:  # a slow step that runs Python, as compiling does
            time.sleep(_POLL_S)
        value = fn()
    finally:
        stop.set()
        helper.join()
    if time.monotonic() - started > bound_s:
        raise PhaseTimeout(f"the {name} phase took more than {bound_s:g} s; it is not retried")
    return value
