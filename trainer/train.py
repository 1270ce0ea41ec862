"""The training loop: build, restore, train, checkpoint, report. One call is one attempt.

Recovery layers wrap this function (in-process restart re-enters it; ft_launcher and the Job
restart the process), so it keeps no state between calls except what it is handed.
"""

from __future__ import annotations

import base64
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Optional, TypeVar

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from trainer.config import FinalError, TrainConfig
from trainer.determinism import make_deterministic
from trainer.data import GlobalSampler, TokenDataset, ensure_local_data
from trainer.events import EventLog
from trainer.faults import FaultInjector, at_point, schedule
from trainer.parallel import DistEnv, build_sharded_model, full_param_sha256, init_process_group
from trainer.phases import run_phase, settle as settle_phases
from trainer.recovery import StateKeeper
from trainer.state import ensure_optimizer_state


KEEPALIVE_S = 0.25
T = TypeVar("T")


@dataclass
class Hooks:
    """What a recovery layer plugs into the loop."""

    store: Optional[dist.Store] = None          # in-process: the wrapper's per-attempt store
    iteration: int = 0                           # in-process attempt number
    keepalive: list[Callable[[], None]] = field(default_factory=list)  # heartbeats, pings

    def alive(self) -> None:
        """Send the keepalives, at most every KEEPALIVE_S: each one is an IPC message, and a
        flood of them delays (NVRx's in-process monitor: starves) the peer that reads them."""
        now = time.monotonic()
        if now - self._last_alive >= KEEPALIVE_S:
            self._last_alive = now
            for fn in self.keepalive:
                fn()

    _last_alive: float = 0.0
    on_ready: list[Callable[[], None]] = field(default_factory=list)
    meta: dict[str, Callable[[], dict]] = field(default_factory=dict)  # saved with checkpoints
    on_restore: dict[str, Callable[[dict], None]] = field(default_factory=dict)
    keep: dict = field(default_factory=dict)     # objects that outlive an attempt
    steps_done: int = 0                          # training steps this attempt completed

    def phase(self, name: str, fn: Callable[[], T], bound_s: float,
              device: Optional[torch.device] = None) -> T:
        """Run set-up or tear-down work outside the progress timeouts, bounded by `bound_s`."""
        return run_phase(name, fn, bound_s, self.alive, device)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10% at max_steps; a function of the step alone."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def wait_for_device(device: torch.device) -> None:
    """Wait for the step's GPU work without holding the GIL.

    `.item()` blocks inside CUDA with the GIL held: a rank stuck behind a hung peer could then
    neither be aborted in-process nor receive the wrapper's restart, and NVRx's monitor would
    have to kill it. Polling an event keeps Python running, so a hang stays recoverable.
    """
    if device.type != "cuda":
        return
    done = torch.cuda.Event()
    done.record()
    while not done.query():
        time.sleep(0.0002)


def rng_state(device: torch.device) -> dict:
    """Generator states as text, so they fit a JSON snapshot header as well as a checkpoint."""
    state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if device.type == "cuda":
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state(device).numpy().tobytes()).decode()
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    def decode(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(decode(state["torch"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(decode(state["cuda"]), device)


class Rank0Log:
    def __init__(self, rank: int):
        self.rank = rank

    def __call__(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)


class NonFiniteError(FinalError):
    """A non-finite loss or gradient norm: the state it produced is never checkpointed."""


def train_step(model, optimizer, tokens: torch.Tensor, lr: float, grad_clip: float,
               before_optimizer: Callable[[], None] = lambda: None
               ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One optimizer step; returns the loss and, with clipping, the total gradient norm."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(input_ids=inputs).logits
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    norm = None
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
    before_optimizer()  # snapshot copies of the previous step must finish reading the state
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), norm


def check_finite(step: int, loss: float, grad_norm: Optional[float]) -> None:
    """Stop before a diverged state reaches a snapshot or a checkpoint."""
    for name, value in (("loss", loss), ("gradient norm", grad_norm)):
        if value is not None and not math.isfinite(value):
            raise NonFiniteError(f"the {name} is {value} at step {step}; training stops before "
                                 "this state is saved (lower --lr, or check the data)")


def _build(cfg: TrainConfig, env: DistEnv, events: EventLog, hooks: Hooks, log: Rank0Log):
    """Process group, model, optimizer and the state keeper, restored to the newest state every
    rank can get. (The process group too: its rendezvous waits for the slowest rank.)"""
    init_process_group(env, cfg.collective_timeout(env.device.type), hooks.store)
    events.emit("pg_ready", iteration=hooks.iteration)
    data = TokenDataset(cfg.data_path or ensure_local_data(), cfg.seq_len)
    from trainer.model import llama_config, parameter_count

    vocab = llama_config(cfg.model).vocab_size
    if data.meta.vocab_size > vocab:
        raise ValueError(f"data in {data.path} uses {data.meta.vocab_size} token ids but model "
                         f"{cfg.model} has a vocabulary of {vocab}")
    n_params = parameter_count(cfg.model)
    model = build_sharded_model(cfg.model, cfg.seed, env, n_params * 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1)
    ensure_optimizer_state(model, optimizer)
    events.emit("model_ready", params=n_params, iteration=hooks.iteration)
    point = partial(at_point, step=-1, rank=env.rank, record_dir=cfg.checkpoint_dir, events=events,
                    attempt=hooks.iteration)
    point("model")
    keeper = StateKeeper(cfg, env, events, hooks.keep, hooks.alive, log)
    keeper.prepare(model, optimizer)
    point("buffers")
    meta = keeper.restore(model, optimizer)
    point("restore")
    return data, model, optimizer, keeper, meta


def run(cfg: TrainConfig, env: DistEnv, events: EventLog, hooks: Optional[Hooks] = None) -> dict:
    """One attempt at training to max_steps; returns this rank's summary."""
    hooks = hooks or Hooks()
    log = Rank0Log(env.rank)
    if cfg.deterministic:
        make_deterministic()
    settle_phases(cfg.startup_timeout, hooks.alive)
    data, model, optimizer, keeper, meta = hooks.phase(
        "startup", lambda: _build(cfg, env, events, hooks, log), cfg.startup_timeout, env.device)
    sampler = GlobalSampler(len(data), cfg.seed)
    step, last_loss = 0, 0.0
    if meta is not None:
        step, last_loss = int(meta["step"]), float(meta.get("loss", 0.0))
        sampler.load_state_dict(meta["sampler"])
        set_rng_state(meta["rng"], env.device)
        for key, fn in hooks.on_restore.items():
            if key in meta:
                fn(meta[key])
        log(f"resumed from step {step} ({cfg.checkpoint_dir})")
    elif cfg.checkpoint_dir:
        log(f"no checkpoint in {cfg.checkpoint_dir}: starting from step 0")

    faults = FaultInjector(
        schedule(cfg.fault_seed, cfg.fault_count, cfg.fault_after_step, cfg.max_steps,
                 env.world_size, cfg.fault_types, cfg.fault_type_weights or None),
        env.rank, Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None, events,
        env.device.type, cfg.fault_probability, cfg.fault_types, cfg.fault_type_weights or None,
        keeper.node_root)
    for fn in hooks.on_ready:
        fn()
    events.emit("train_start", step=step, iteration=hooks.iteration)
    tokens_per_step = env.world_size * cfg.batch_size * cfg.seq_len

    def state_meta(at_step: int) -> dict:
        return _meta(at_step, sampler, env, hooks, float(loss))

    def one_step() -> tuple[list[int], torch.Tensor, float]:
        indices = sampler.next_batch(env.rank, env.world_size, cfg.batch_size)
        batch = torch.from_numpy(np.stack([data.sample(i) for i in indices])).to(env.device)
        out, norm = train_step(model, optimizer, batch, lr_at(step, cfg), cfg.grad_clip,
                               keeper.fence)
        wait_for_device(env.device)
        value = float(out.item())  # the device is done: honest step times
        check_finite(step + 1, value, None if norm is None else float(norm))
        return indices, out, value

    window_t, window_steps, window_stall = time.perf_counter(), 0, 0.0
    loss = torch.tensor(last_loss, device=env.device)

    while step < cfg.max_steps:
        faults.at_step(step + 1)
        t0 = time.perf_counter()
        if hooks.steps_done == 0:  # lazy kernel, allocator and communicator set-up: a phase
            indices, loss, loss_value = hooks.phase("first_step", one_step, cfg.startup_timeout,
                                                    env.device)
        else:
            indices, loss, loss_value = one_step()
        step += 1
        hooks.steps_done += 1
        dt = time.perf_counter() - t0
        hooks.alive()
        stall = keeper.after_step(step, model, optimizer, state_meta)
        if env.rank == 0:
            events.emit("step", step=step, dt=dt, stall=stall, loss=loss_value)
        if cfg.trace_samples:
            events.emit("samples", step=step, indices=indices)
        window_steps += 1
        window_stall += stall
        if step % cfg.log_interval == 0 or step == cfg.max_steps:
            mean = loss.clone()
            dist.all_reduce(mean)
            elapsed = time.perf_counter() - window_t
            log(f"step {step:>6}/{cfg.max_steps} | loss {float(mean) / env.world_size:.4f} | "
                f"{tokens_per_step * window_steps / elapsed:>10,.0f} tok/s | "
                f"ckpt stall {window_stall:.3f} s")
            window_t, window_steps, window_stall = time.perf_counter(), 0, 0.0

    def finish() -> dict:
        keeper.finish(step, model, optimizer, state_meta)
        final_loss = loss.clone()
        dist.all_reduce(final_loss)
        return {"steps_completed": step, "final_loss": float(final_loss) / env.world_size,
                "param_sha256": full_param_sha256(model), **keeper.stats()}

    summary = hooks.phase("final", finish, cfg.checkpoint_timeout + cfg.startup_timeout, env.device)
    events.emit("train_end", **summary)
    return summary


def _meta(step: int, sampler: GlobalSampler, env: DistEnv, hooks: Hooks, loss: float) -> dict:
    """Everything besides tensors that a resume needs; JSON-able (snapshot headers are JSON)."""
    meta = {"step": step, "sampler": sampler.state_dict(), "rng": rng_state(env.device),
            "loss": loss, "saved_at": time.time()}
    meta.update({key: fn() for key, fn in hooks.meta.items()})
    return meta
