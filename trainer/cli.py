"""`python -m trainer`: parse, pick the recovery layer, train, write results.json (rank 0)."""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from trainer.config import TrainConfig, parse_args
from trainer.preflight import check_environment
from trainer.errors import ConfigError, FinalError
from trainer.recovery.forkserver import forked_worker
from trainer.recovery.launch import record_final_error
from trainer.lifetime import leave

if TYPE_CHECKING:
    from trainer.nvrx_compat import AsyncWriter


def write_results(cfg: TrainConfig, summary: dict) -> dict:
    """results.json (rank 0, once training has ended): the figures of the event log, merged
    from every node's file, and this rank's summary. A damaged log costs its unreadable lines
    (counted in `event_log`), never the results."""
    from trainer.accounting.events import LogStats, events_dir, read_events
    from trainer.accounting.goodput import summarize
    from trainer.atomic import write_json_atomic

    results: dict = {"mode": cfg.mode}
    if cfg.output_dir is not None:
        stats = LogStats()
        try:
            results.update(summarize(read_events(events_dir(cfg.output_dir), stats),
                                     cfg.max_steps, cfg.checkpoint_interval))
        except ValueError as exc:  # nothing readable at all
            print(f"rank 0: warning: no figures from the event log: {exc}", file=sys.stderr)
        results["event_log"] = stats.to_dict()
        if stats.warning():
            print(f"rank 0: warning: {stats.warning()}", file=sys.stderr, flush=True)
    results.update({k: v for k, v in summary.items() if k != "checkpoint"})
    results["config"] = cfg.to_dict()
    if cfg.results_path:
        path = Path(cfg.results_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, results)
    return results


def exit_now(hooks, events, rank: Optional[int] = None) -> None:
    """End a failed rank at once, so the launcher restarts the workers in seconds; with its
    `rank`, tell the peers to leave too (`failfast`), so that their exits overlap this one.

    An orderly exit would tear down the process group while the other ranks wait in a
    collective for this one: it blocks until the launcher's heartbeat timeout or the collective
    timeout kills them. Nothing an orderly exit does is needed for a correct restart: snapshot
    copies that have landed are committed first, a checkpoint being written never becomes
    visible, and the background writer dies with its parent. The `leaving` stamp splits a
    relaunch's detection into this rank's own way out and its process's teardown.
    """
    from trainer.tiers import Tiers

    if rank is not None:
        from trainer.recovery import failfast

        failfast.announce(rank)
    t0 = time.perf_counter()
    Tiers.abandon(hooks.process)
    events.emit("leaving", abandon_s=round(time.perf_counter() - t0, 4))
    leave(1)


def _leave_with_failed_peers(hooks, rank: int, events) -> None:
    """Once training runs: a peer's announced failure ends this rank as its own would."""
    from trainer.recovery import failfast

    def leave(failed: int) -> None:
        if failed != rank:
            events.emit("peer_failed", failed_rank=failed)
            exit_now(hooks, events)

    failfast.watch(leave)


def _watch_neighbour_node(hooks, env, events) -> None:
    """Where the launcher asks for it, each node's first rank watches the next node
    (`nodewatch`); a silent one ends this rank as a failure would, and the launcher's new round
    seats a spare in its place."""
    if env.local_rank != 0:
        return
    from trainer.recovery import nodewatch

    def silent(node: int, seconds: float) -> None:
        ranks = list(range(node * env.local_world_size, (node + 1) * env.local_world_size))
        events.emit("node_silent", node=node, ranks=ranks, silent_s=round(seconds, 2))
        print(f"rank {env.rank}: node {node} of this round has been silent for {seconds:.1f} s; "
              "leaving so that the launcher restarts without it", file=sys.stderr, flush=True)
        exit_now(hooks, events, ranks[0])  # the peers leave too, told which rank failed

    nodewatch.start(env.node_rank, env.world_size // env.local_world_size, silent)


def stopped_line(cfg: TrainConfig, summary: dict) -> str:
    """What a rank 0 stopped by SIGTERM says last: where the next run resumes, and why."""
    step, latest = summary["steps_completed"], summary["committed_step"]
    head = f"stopped by SIGTERM at step {step}"
    if latest == step:
        return f"{head}: checkpoint step {step} committed; the next run resumes from it"
    resumes = f"the next run resumes from step {latest}" if latest is not None else \
        "no checkpoint yet: the next run starts from step 0"
    if not cfg.checkpoint_dir:
        return f"{head}: no --checkpoint_dir, nothing kept"
    need = summary["need_s"] or 0.0
    return (f"{head}: step {step} not written, too little of the {cfg.termination_grace:g} s "
            f"grace period (--termination_grace) was left for its write (about {need:.0f} s); "
            f"{resumes}")


def final_exit(exc: Exception, rank: int) -> int:
    """An error no restart can fix: handed to the supervising launcher (which stops the job and
    says it) and said in one line; returns the exit code, 2. One that every rank raises alike
    (`same_on_every_rank`) is said once, by the launcher, or without one by rank 0; one that
    a single rank meets is said by that rank, with its number."""
    same = getattr(exc, "same_on_every_rank", False)
    handed = record_final_error(str(exc) if same else f"rank {rank}: {exc}")
    if not same:
        print(f"rank {rank}: error: {exc}", file=sys.stderr, flush=True)
    elif rank == 0 and not handed:
        print(f"python -m trainer: error: {exc}", file=sys.stderr, flush=True)
    return 2


def fork_writer(cfg: TrainConfig) -> Optional[AsyncWriter]:
    """The rank's checkpoint writer, forked first thing: this process has imported torch, so the
    writer starts in milliseconds, and it has no CUDA context, process group or socket yet that
    the writer would hold a copy of (`nvrx_compat.AsyncWriter`). None where no writer is used."""
    if not (cfg.checkpoint_dir and cfg.use_async_checkpoint):
        return None
    from trainer.nvrx_compat import AsyncWriter

    return AsyncWriter(int(os.environ.get("RANK", 0)), fork=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg = parse_args(argv)
    try:  # checked before launch too; here once more, in case the files changed since
        check_environment(cfg)
    except ConfigError as exc:
        return final_exit(exc, int(os.environ.get("RANK", 0)))
    from config.contract import LAUNCHER_ID_ENV
    from trainer.accounting.events import process_log

    events = process_log(cfg.output_dir)
    # Stamped before torch is imported: a restart's breakdown shows the import time too.
    events.emit("launch", mode=cfg.mode, world_size=int(os.environ.get("WORLD_SIZE", 1)),
                launcher_restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                launcher=os.environ.get(LAUNCHER_ID_ENV), forked=forked_worker())
    import torch.distributed as dist

    from trainer.distributed import dist_env
    from trainer.hooks import Hooks
    from trainer.tiers import Tiers

    hooks, failed = Hooks(), True
    hooks.process.writer = fork_writer(cfg)
    try:
        env = dist_env(cfg.device)
    except RuntimeError as exc:
        Tiers.release(hooks.process, failed=True)
        print(f"python -m trainer: error: {exc}", file=sys.stderr)
        return 2
    events.emit("imported")
    from trainer.loop.train import run

    _watch_neighbour_node(hooks, env, events)
    try:
        if cfg.ft_launcher:
            from trainer.recovery.heartbeat import attach_heartbeat

            attach_heartbeat(hooks, events)
        if not cfg.inprocess:  # the launcher restarts every worker: leave with a failed peer
            hooks.on_ready.append(lambda: _leave_with_failed_peers(hooks, env.rank, events))
        if cfg.inprocess:
            from trainer.recovery.inprocess import run_inprocess

            summary = run_inprocess(cfg, env, events, hooks)
        else:
            from trainer.recovery.stores import external_group_store

            hooks.store = external_group_store(cfg.collective_timeout(env.device.type))
            summary = run(cfg, env, events, hooks)
        # stopped by SIGTERM without committing its newest state: what the tiers hold stays
        failed = bool(summary.get("stopped")) and \
            summary["committed_step"] != summary["steps_completed"]
    except (ConfigError, FinalError) as exc:  # no restart can fix it: one line, exit 2
        events.emit("error", type=type(exc).__name__, message=str(exc)[:500], fatal=True)
        return final_exit(exc, env.rank)
    except Exception as exc:  # one clear line per rank; the traceback goes to stderr below it
        events.emit("error", type=type(exc).__name__, message=str(exc)[:500])
        print(f"rank {env.rank}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        traceback.print_exc()
        if not cfg.inprocess:  # the launcher restarts the workers: leave now, see exit_now
            exit_now(hooks, events, env.rank)
        return 1
    except BaseException as exc:  # NVRx's RestartAbort: in-process restarts ended the job
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        if exc.__cause__ is None:  # the iteration limit or the world size, not one error
            events.emit("error", type=type(exc).__name__, message=str(exc)[:500], fatal=True)
        if isinstance(exc.__cause__, (ConfigError, FinalError)):
            return final_exit(exc.__cause__, env.rank)
        print(f"rank {env.rank}: error: in-process restart gave up: {exc}", file=sys.stderr,
              flush=True)
        return 1
    finally:
        if cfg.ft_launcher:
            from trainer.recovery.heartbeat import detach_heartbeat

            detach_heartbeat(hooks)
        Tiers.release(hooks.process, failed)
        if hooks.process.telemetry is not None:
            hooks.process.telemetry.close()
        if cfg.inprocess:  # the groups of failed attempts, still shutting down
            from trainer.recovery.abort import join_pending

            join_pending(cfg.collective_timeout(env.device.type))
        if dist.is_initialized():
            dist.destroy_process_group()
    if summary.get("stopped"):  # no results.json: the run is not over, the next one resumes it
        if env.rank == 0:
            print(stopped_line(cfg, summary), flush=True)
        return 0
    if env.rank == 0:
        results = write_results(cfg, summary)
        print(f"done: {results['steps_completed']} steps in {results.get('wall_seconds', 0):.1f} s, "
              f"param_sha256 {results['param_sha256'][:16]}")
    return 0
