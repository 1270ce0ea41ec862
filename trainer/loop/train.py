"""The training loop: build, restore, train, checkpoint, report. One call is one attempt.

Recovery layers wrap this function (in-process restart re-enters it; ft_launcher and the Job
restart the process), so it keeps no state between calls except what it is handed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from trainer.accounting.events import EventLog
from trainer.config import TrainConfig, accumulation_steps
from trainer.durable.state import ensure_optimizer_state
from trainer.errors import ConfigError, FinalError
from trainer.faults.inject import FaultInjector, at_point
from trainer.faults.schedule import schedule
from trainer.loop.data import GlobalSampler, TokenDataset, ensure_local_data
from trainer.loop.llama import LlamaArgs
from trainer.loop.determinism import make_deterministic
from trainer.distributed import DistEnv, init_process_group
from trainer.hooks import Hooks
from trainer.leftovers import Attempt, memory_now, start_clean
from trainer.telemetry.metrics import (StepReadback, StepRecord, Throughput, Window, device_name,
                                      peak_flops)
from trainer.loop.parallel import build_sharded_model
from trainer.loop.precision import Precision
from trainer.loop.precision import choose as choose_precision
from trainer.loop.profiling import StepProfiler, profile_line
from trainer.loop.state import RngState, TrainState, load_state, save_state
from trainer.loop.weights import initialize_weights, param_fingerprint
from trainer import termination
from trainer.phases import injected_delay, join_interrupted
from trainer.tiers import Tiers


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10% at max_steps; a function of the step alone."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def to_device(tokens: np.ndarray, device: torch.device) -> torch.Tensor:
    """On a GPU, through pinned memory and without blocking: a copy from pageable memory would
    make the host wait for all the work queued before it."""
    t = torch.from_numpy(tokens)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def wait_for_device(device: torch.device, done: Optional["torch.cuda.Event"] = None) -> None:
    """Wait for GPU work (all queued so far, or up to `done`) without holding the GIL.

    `.item()` blocks inside CUDA with the GIL held: a rank stuck behind a hung peer could then
    neither be aborted in-process nor receive the wrapper's restart, and NVRx's monitor would
    have to kill it. Polling an event keeps Python running, so a hang stays recoverable.
    """
    if device.type != "cuda":
        return
    if done is None:
        done = torch.cuda.Event()
        done.record()
    while not done.query():
        time.sleep(0.0002)


class Rank0Log:
    def __init__(self, rank: int):
        self.rank = rank

    def __call__(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)


class NonFiniteError(FinalError):
    """A non-finite loss or gradient norm: the state it produced is never checkpointed. Both
    are all-reduced, so every rank stops at the same step with the same message."""

    same_on_every_rank = True


def check_finite(step: int, loss: float, grad_norm: float) -> None:
    """Stop before a diverged state reaches a durable checkpoint."""
    for name, value in (("loss", loss), ("gradient norm", grad_norm)):
        if not math.isfinite(value):
            raise NonFiniteError(f"the {name} is {value} at step {step}; training stops before "
                                 "this state is saved (lower --lr, or check the data)")


def train_step(model, optimizer, micro_batches: list[torch.Tensor], lr: float, grad_clip: float,
               world_size: int, tokens_per_step: int,
               before_optimizer: Callable[[], None] = lambda: None,
               stop: bool = False) -> torch.Tensor:
    """One optimizer step over this rank's micro-batches; returns [loss, grad norm, ranks that
    asked to stop] on the device, not read back: the loss is the mean over every token of the
    global batch; `stop` (this rank was asked to stop) rides in the loss's all-reduce.

    Each token weighs 1 / tokens_per_step whichever rank and micro-batch holds it; FSDP averages
    gradients over ranks, hence the factor world_size. So world 1 with batch 4 and world 2 with
    batch 2 (or batch 2 accumulated twice) compute the same step.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    scale = world_size / tokens_per_step
    loss_sum = torch.zeros((), device=micro_batches[0].device)
    for tokens in micro_batches:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = model(inputs)
        part = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
        (part * scale).backward()
        loss_sum += part.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                               grad_clip if grad_clip > 0 else math.inf)
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    before_optimizer()  # snapshot copies of the previous step must finish reading the state
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    reduced = torch.stack([loss_sum / tokens_per_step, torch.full_like(loss_sum, float(stop))])
    dist.all_reduce(reduced)  # queued like any collective: no host sync
    loss, stops = reduced.unbind()
    return torch.stack([loss, grad_norm.detach().to(loss.dtype), stops])


@dataclass
class Built:
    """What an attempt's start-up builds, restored to the newest state every rank can get."""

    data: TokenDataset
    model_config: LlamaArgs
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    tiers: Tiers
    faults: FaultInjector
    meta: Optional[dict]  # the restored state's meta; None: a fresh start
    precision: Precision  # the forward and backward passes' dtype


def _build(cfg: TrainConfig, env: DistEnv, events: EventLog, hooks: Hooks, log: Rank0Log,
           precision: Precision) -> Built:
    """Process group, model, optimizer and the tiers, restored to the newest state every rank
    can get. (The process group too: its rendezvous waits for the slowest rank.)"""
    Tiers.warm(cfg, env)
    timeout = cfg.collective_timeout(env.device.type)
    init_process_group(env, timeout, hooks.store)
    events.emit("pg_ready", iteration=hooks.iteration)
    t0 = time.perf_counter()
    data = TokenDataset(cfg.data_path or ensure_local_data(), cfg.seq_len)
    from trainer.loop.model import llama_config, optimizer_groups, parameter_count

    if cfg.global_batch_size:  # an explicit global batch that this world cannot keep: say so now
        accumulation_steps(cfg.global_batch_size, cfg.batch_size, env.world_size)
    model_config = llama_config(cfg.model)
    if data.meta.vocab_size > model_config.vocab_size:
        raise ConfigError(f"data in {data.path} uses {data.meta.vocab_size} token ids but model "
                         f"{cfg.model} has a vocabulary of {model_config.vocab_size}")
    n_params = parameter_count(cfg.model)
    model = build_sharded_model(cfg.model, cfg.seed, env, n_params * 4, compile=cfg.compile,
                                activation_checkpointing=cfg.activation_checkpointing,
                                initialize=False,  # a restore would overwrite the init
                                compute_dtype=precision.dtype)
    t1 = time.perf_counter()
    # Fused: one operator per parameter group instead of ten foreach operators, each of which
    # DTensor dispatches (and, in a new process or thread, first propagates shardings for).
    optimizer = torch.optim.AdamW(optimizer_groups(model, cfg.weight_decay), lr=cfg.lr,
                                  betas=(0.9, 0.95), eps=1e-8, fused=True)
    ensure_optimizer_state(model, optimizer)
    events.emit("model_ready", params=n_params, iteration=hooks.iteration, model_s=t1 - t0,
                optimizer_s=time.perf_counter() - t1)
    point = partial(at_point, step=-1, rank=env.rank, record_dir=cfg.checkpoint_dir, events=events,
                    attempt=hooks.iteration)
    point("model")
    t0 = time.perf_counter()
    tiers = Tiers(cfg, env, events, hooks.process, hooks.alive, log)
    tiers_s = time.perf_counter() - t0
    # Before the restore's collectives: a node fault right after them finds every rank's pid.
    faults = FaultInjector(
        schedule(cfg.fault_seed, cfg.fault_count, cfg.fault_after_step, cfg.max_steps,
                 env.world_size, cfg.fault_types, cfg.fault_type_weights or None),
        env.rank, Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None, events,
        env.device.type, cfg.fault_probability, cfg.fault_types, cfg.fault_type_weights or None,
        tiers.node_root)
    seconds = tiers.prepare(model, optimizer)
    point("buffers")
    events.emit("buffers_ready", iteration=hooks.iteration, tiers_s=tiers_s, **seconds)
    meta = tiers.restore(model, optimizer)
    if meta is None:
        initialize_weights(model, cfg.model, cfg.seed, n_params * 4)
    point("restore")
    return Built(data, model_config, model, optimizer, tiers, faults, meta, precision)


def run(cfg: TrainConfig, env: DistEnv, events: EventLog, hooks: Optional[Hooks] = None) -> dict:
    """One attempt at training to max_steps; returns this rank's summary."""
    hooks = hooks or Hooks()
    log = Rank0Log(env.rank)
    if hooks.iteration > 0:  # an in-process restart: nothing of the failed attempt may remain
        events.emit("leftovers", iteration=hooks.iteration,
                    **start_clean(hooks.process.previous, env.device))
    hooks.process.previous = attempt = Attempt()
    if cfg.deterministic:
        make_deterministic()
    join_interrupted(cfg.startup_timeout, hooks.alive)
    precision = choose_precision(cfg.compute_dtype, env.device.type)
    if hooks.iteration == 0:  # an in-process restart computes as its first attempt did
        log(precision.line())
    built = hooks.phase("startup", lambda: _build(cfg, env, events, hooks, log, precision),
                        cfg.startup_timeout, env.device)
    loop = Loop(cfg, env, events, hooks, built, log)
    attempt.track(model=built.model, optimizer=built.optimizer, loop=loop)
    for fn in hooks.on_ready:
        fn()
    events.emit("train_start", step=loop.train_state.step, iteration=hooks.iteration,
                max_steps=cfg.max_steps, tokens_per_step=loop.tokens_per_step)
    loop.train()
    summary = hooks.phase("final", loop.finish, cfg.checkpoint_timeout + cfg.startup_timeout,
                          env.device)
    events.emit("train_end", **summary)
    return summary


class Loop:
    """One attempt's training state (step, data position, newest loss) and its step loop."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, events: EventLog, hooks: Hooks,
                 built: Built, log: Rank0Log):
        from trainer.loop.model import flops_per_token

        self.cfg, self.env, self.events, self.hooks, self.log = cfg, env, events, hooks, log
        self.data, self.model, self.optimizer = built.data, built.model, built.optimizer
        self.tiers, self.faults, self.precision = built.tiers, built.faults, built.precision
        self.sampler = GlobalSampler(len(self.data), cfg.seed)
        self.rng = RngState(env.device)
        self.train_state = TrainState(
            global_batch=cfg.global_batch_size or cfg.batch_size * env.world_size)
        self.stopping = False  # a rank was asked to stop: stop after this step (`termination`)
        self.step_delay = injected_delay("step")  # test hook: a device-bound step's host wait
        if built.meta is not None:
            self._resume(built.meta)
        elif cfg.checkpoint_dir:
            log(f"no checkpoint in {cfg.checkpoint_dir}: starting from step 0")
        st = self.train_state
        # The global batch is what the optimizer sees; it survives any change of world size.
        self.accum = accumulation_steps(st.global_batch, cfg.batch_size, env.world_size) \
            if st.step < cfg.max_steps else 1
        self.tokens_per_step = st.global_batch * cfg.seq_len
        self.perf = Throughput(flops_per_token(built.model_config, cfg.seq_len),
                               peak_flops(env.device), self.tokens_per_step, env.world_size,
                               device_name(env.device))
        self.readback = StepReadback(env.device, wait_for_device)
        self.profiler = StepProfiler(cfg.profile_from, cfg.profile_steps,
                                     cfg.output_dir / "profile" if cfg.output_dir else None,
                                     env.rank, env.device)
        self.window = Window(time.perf_counter())
        if hooks.process.telemetry is None:
            from trainer.telemetry.report import Telemetry

            hooks.process.telemetry = Telemetry(cfg, env)
        self.telemetry = hooks.process.telemetry
        self.telemetry.begin(st.step)
        self.tiers.begin(st.step)

    def _resume(self, meta: dict) -> None:
        cfg, st = self.cfg, self.train_state
        load_state(meta, st, required={"sampler": self.sampler, "rng": self.rng},
                   optional=self.hooks.stateful)
        if cfg.global_batch_size and st.global_batch != cfg.global_batch_size:
            self.log(f"--global_batch_size {cfg.global_batch_size} replaces the checkpoint's "
                     f"{st.global_batch}")
        st.global_batch = cfg.global_batch_size or st.global_batch

    def train(self) -> None:
        """Steps to max_steps, each reported one step later, when its figures are on the host."""
        cfg, hooks, st = self.cfg, self.hooks, self.train_state
        while st.step < cfg.max_steps and not self.stopping:
            self.faults.at_step(st.step + 1)
            self.profiler.before(st.step + 1)
            if hooks.steps_done == 0:  # lazy kernel, allocator and compile set-up: bounded
                rec = hooks.phase_here("first_step", self.one_step, cfg.startup_timeout)
            else:
                rec = self.one_step()
            st.step += 1
            if (profile := self.profiler.after(st.step)) is not None:
                self.log(profile_line(profile, self.profiler.out_dir))
            hooks.steps_done += 1
            hooks.alive()
            if self.tiers.saves_durably(st.step):  # only verified steps reach the durable tier
                for pending in self.readback.wait_all():
                    self.verify(pending)
            rec.stall, rec.snapshot_s = self.tiers.after_step(st.step, self.model,
                                                              self.optimizer, self.meta)
            for done in self.readback.ready():  # on a GPU: the previous step, while this one runs
                self.report(done)
        for done in self.readback.ready(in_flight=0):
            self.report(done)

    def one_step(self) -> StepRecord:
        cfg, env = self.cfg, self.env
        step = self.train_state.step
        rec = self.readback.begin(step + 1, lr_at(step, cfg))
        micro, drawn = [], []
        for _ in range(self.accum):
            indices = self.sampler.next_batch(env.rank, env.world_size, cfg.batch_size)
            drawn.extend(indices)
            micro.append(to_device(np.stack([self.data.sample(i) for i in indices]), env.device))
        if cfg.trace_samples:  # before the step's update can be saved: a commit implies its record
            self.events.emit("samples", step=step + 1, indices=drawn)
        stats = train_step(self.model, self.optimizer, micro, rec.lr, cfg.grad_clip,
                           env.world_size, self.tokens_per_step, self.tiers.fence,
                           stop=termination.requested())
        self.readback.queue(rec, stats)
        if self.step_delay:
            time.sleep(self.step_delay)
        return rec

    def verify(self, rec: StepRecord) -> None:
        if not (math.isfinite(rec.loss) and math.isfinite(rec.grad_norm)):
            self.tiers.discard_snapshots_from(rec.step)  # never a resume point
            check_finite(rec.step, rec.loss, rec.grad_norm)

    def report(self, rec: StepRecord) -> None:
        self.verify(rec)
        self.train_state.loss = rec.loss
        if rec.stop_requests and not self.stopping:  # every rank reads the same step's count
            self.stopping = True
            self.events.emit("stop_requested", step=rec.step, ranks=rec.stop_requests,
                             signalled=termination.requested())
        self.perf.add(rec.dt)
        self.tiers.observe(rec.step, rec.dt, rec.snapshot_s)
        if self.env.rank == 0:
            self.events.emit("step", step=rec.step, dt=rec.dt, stall=rec.stall,
                             snapshot_s=rec.snapshot_s, loss=rec.loss, grad_norm=rec.grad_norm,
                             done=rec.done)
        self.window.add(rec)
        if rec.step % self.cfg.log_interval == 0 or rec.step == self.cfg.max_steps:
            figures = self.window.figures(rec.step, self.cfg.max_steps, self.perf, self.env.device)
            self.telemetry.report(figures, self.log)
            self.window.reset(time.perf_counter())

    def meta(self, at_step: int) -> dict:
        """Everything besides tensors that a resume needs (`loop.state`); JSON-able (snapshot
        headers are JSON)."""
        return save_state(self.train_state, at_step,
                          {"sampler": self.sampler, "rng": self.rng, **self.hooks.stateful})

    def finish(self) -> dict:
        """The final checkpoint and this rank's summary. The fingerprint's all-reduce comes
        first: in tiers.finish, rank 0 publishes the final checkpoint after the last collective,
        so no rank waits for that in a collective."""
        if self.stopping:
            return self.finish_stopped()
        param_sha256 = param_fingerprint(self.model)
        st = self.train_state
        self.tiers.finish(st.step, self.model, self.optimizer, self.meta)
        self.faults.close()
        return {"steps_completed": st.step, "final_loss": st.loss,
                "param_sha256": param_sha256, "compute_dtype": self.precision.name,
                "global_batch_size": st.global_batch,
                "accumulation_steps": self.accum, "device_memory": memory_now(self.env.device),
                **self.perf.summary(), **self.tiers.stats()}

    def finish_stopped(self) -> dict:
        """Asked to stop: commit this step if it is newer than the last checkpoint and every
        rank expects the write to fit in the grace left (`termination`); no hash, no final
        figures. Returns what the stop kept, for the exit line."""
        cfg, tiers, step = self.cfg, self.tiers, self.train_state.step
        t0 = time.perf_counter()
        need = tiers.seconds_to_save(step)
        save = need is not None and termination.time_allows(need, cfg.termination_grace,
                                                            self.env.device)
        tiers.finish(step, self.model, self.optimizer, self.meta, save=save)
        latest = tiers.checkpoints.store.latest_step() if tiers.checkpoints is not None else None
        self.events.emit("stopped", step=step, committed=latest, wrote=save,
                         need_s=need, seconds=time.perf_counter() - t0)
        if not termination.requested():
            raise termination.PeerTerminating(
                f"another rank was asked to stop (SIGTERM); stopped with it at step "
                f"{step}, newest checkpoint: step {latest}")
        return {"steps_completed": step, "stopped": True, "committed_step": latest,
                "need_s": need, "wrote": save}
