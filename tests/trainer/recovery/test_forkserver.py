"""Workers forked from a process that has imported the trainer (trainer.recovery.forkserver)."""

import inspect
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.jobs import COMPUTE_DTYPE, ROOT, env_for
from trainer.recovery.forkserver import PRELOAD

pytestmark = pytest.mark.slow  # real fork servers and launchers


def _report_group(queue) -> None:
    queue.put((os.getpid(), os.getpgrp()))


def test_a_forked_worker_leads_its_own_process_group_before_its_pid_is_known():
    """A launcher that signals its workers' groups must never hit its own (NVRx 0.7 does)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["trainer.recovery.worker_groups"])
    queue = ctx.Queue()
    proc = ctx.Process(target=_report_group, args=(queue,))
    proc.start()
    seen_at_once = os.getpgid(proc.pid)
    pid, group = queue.get(timeout=60)
    proc.join(timeout=60)
    assert seen_at_once == group == pid == proc.pid != os.getpgrp()


def test_every_preloaded_module_imports_without_touching_cuda():
    """The fork server skips a module that fails to import, silently: a typo here would only
    show as slower restarts."""
    code = ("import importlib, sys, torch\n"
            f"for name in {list(PRELOAD)!r}:\n"
            "    importlib.import_module(name)\n"
            "print(torch.cuda.is_initialized())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


FORKED_TRAINER = """
import multiprocessing, os, sys
from trainer.recovery.forkserver import PRELOAD

def train(argv):
    from trainer.cli import main
    sys.exit(main(argv))

if __name__ == "__main__":
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    worker = ctx.Process(target=train, args=(sys.argv[1:],))
    worker.start()
    worker.join()
    sys.exit(worker.exitcode if worker.exitcode >= 0 else 128 - worker.exitcode)
"""


def test_a_worker_forked_after_the_preload_trains(cache_dir, tmp_path):
    """A worker forked from a fork server that imported everything PRELOAD names builds the
    model on a phase thread and runs backward on its main thread, as ft_launcher's workers do.
    Under a CUDA build of torch with no GPU visible (the image's torch on CPU ranks), that
    crashed in the first backward unless the CUDA device guard was set on the main thread
    (`trainer.distributed.keep_cuda_guard_alive`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "forked_trainer.py"
    script.write_text(FORKED_TRAINER)
    env = {**env_for(cache_dir), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run([sys.executable, str(script), "--model", "tiny", "--device", "cpu",
                           "--seq_len", "64", "--batch_size", "2", "--max_steps", "2",
                           "--use_async_checkpoint", "false", "--final_checkpoint", "false",
                           "--results_path", str(tmp_path / "results.json"), *COMPUTE_DTYPE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert json.loads((tmp_path / "results.json").read_text())["steps_completed"] == 2


def _group(code: str) -> subprocess.Popen:
    """A process leading a process group of its own, like a forked worker."""
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                            stdout=subprocess.PIPE, text=True)


def test_stopping_worker_groups_terminates_kills_and_skips_empty_ones():
    from trainer.nvrx_compat import stop_worker_groups

    polite = _group("import time; time.sleep(600)")
    stubborn = _group("import signal, time, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('ready', flush=True); time.sleep(600)")
    gone = _group("pass")
    gone.wait()
    assert stubborn.stdout.readline().strip() == "ready"  # its handler is in place
    stop_worker_groups({polite.pid, stubborn.pid, gone.pid}, grace_s=2.0)
    assert polite.wait(timeout=30) == -signal.SIGTERM
    assert stubborn.wait(timeout=30) == -signal.SIGKILL


def test_a_group_left_with_zombies_is_empty():
    """A worker's child that exited under a parent that never reaps it is a zombie: it keeps the
    group signallable, but a stop that waited for it would always wait out its grace."""
    from trainer.nvrx_compat import live_groups

    running = _group("import time; time.sleep(600)")
    zombie = _group("pass")  # never waited for until the end: it stays a zombie
    try:
        stat = Path(f"/proc/{zombie.pid}/stat")
        for _ in range(600):
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        os.killpg(zombie.pid, 0)  # still signallable
        assert live_groups({running.pid, zombie.pid}) == {running.pid}
    finally:
        running.kill()
        running.wait()
        zombie.wait()


def test_stopping_worker_groups_leaves_group_one_alone():
    """NVRx's own exception (its tests run rank monitors in group 1); signalling it here would
    reach every process of a container."""
    from trainer.nvrx_compat import stop_worker_groups

    victim = _group("import time; time.sleep(600)")
    try:
        stop_worker_groups({1, victim.pid}, grace_s=0.1)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_only_nvrx_07s_group_cleanup_is_replaced():
    import types

    from nvidia_resiliency_ext.fault_tolerance import launcher

    from trainer.nvrx_compat import stop_worker_groups, use_stop_worker_groups

    installed = getattr(launcher, "terminate_mp_processes", None)
    use_stop_worker_groups(launcher)
    if installed is not None and "allowed_ppids" in inspect.signature(installed).parameters:
        assert launcher.terminate_mp_processes is installed  # 0.4.1: another function
    nvrx_07 = types.SimpleNamespace(terminate_mp_processes=lambda allowed_pgids: None)
    use_stop_worker_groups(nvrx_07)
    assert nvrx_07.terminate_mp_processes is stop_worker_groups


def test_the_launchers_first_worker_failure_log_imports_nothing():
    """torch's log formatter imports torch._dynamo for a record with a traceback; in the launcher
    the first such record is the first worker failure, and the import delayed the restart."""
    code = ("import sys, torch.distributed.elastic.multiprocessing.api as api\n"
            "from trainer.recovery.forkserver import plain_elastic_logs\n"
            "if sys.argv[1] == 'plain':\n"
            "    plain_elastic_logs()\n"
            "try:\n"
            "    raise RuntimeError('worker failed')\n"
            "except RuntimeError:\n"
            "    api.logger.exception('failed (exitcode: 1)')\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = {how: subprocess.run([sys.executable, "-c", code, how], cwd=ROOT, capture_output=True,
                               text=True, timeout=120) for how in ("torch", "plain")}
    assert out["torch"].stdout.split() == ["True"]  # the cause, still there in torch's formatter
    assert out["plain"].stdout.split() == ["False"]
    assert "RuntimeError: worker failed" in out["plain"].stderr
    assert "failed (exitcode: 1)" in out["plain"].stderr


class _BarrierState:
    """The shape of NVRx 0.7's `_RendezvousBarrierState` wait: look, sync, sleep 1 s, look again."""

    def __init__(self) -> None:
        self._round, self.open_rounds, self.sleeps = 0, {1}, 0

    def _sync_from_per_round_state(self) -> bool:
        newer = max(self.open_rounds)
        synced, self._round = newer > self._round, max(newer, self._round)
        return synced

    def _wait_for_rendezvous_open(self, node_desc) -> None:
        while self._round not in self.open_rounds:
            self._sync_from_per_round_state()
            self.sleeps += 1


def test_a_launcher_joins_the_round_it_has_just_opened_without_sleeping():
    from trainer.nvrx_compat import use_prompt_rendezvous

    before = _BarrierState()
    before._wait_for_rendezvous_open("node")
    assert before.sleeps == 1 and before._round == 1
    use_prompt_rendezvous(_BarrierState)
    use_prompt_rendezvous(_BarrierState)  # once only
    after = _BarrierState()
    after._wait_for_rendezvous_open("node")
    assert after.sleeps == 0 and after._round == 1
