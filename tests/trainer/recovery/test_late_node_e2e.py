"""A node that comes after the run has ended: a lost node's replacement pod, scheduled once a new
instance is up, finds the rendezvous closed (NVRx before 0.6) or waits in it as a standby (0.6+).
Its launcher exits 0 and records no failure, so the Job that trained to the end does not end
Failed; before the end, a node that finds the rendezvous closed still fails, and a standby keeps
waiting for a seat. Real store process, real pods' launchers (ft_launcher), one CPU rank each."""

import subprocess
import time

from devtools.local import free_port_block, start_store
from tests.jobs import (ROOT, env_for, events, kill_group, launcher_cmd, ok, pace, recovery_flags,
                        start, stretched)
from trainer.recovery.launch import END_POLL_S, LaunchSpec
from trainer.nvrx_compat import rendezvous_finds_silent_nodes

MODE = "ft_launcher"
STEPS = 2


def node_cmd(run_dir, port: int, node: int, *trainer_args: str) -> list[str]:
    """The pod of completion index `node` in a run of one training node and one spare."""
    cmd = launcher_cmd(MODE, run_dir, port, *trainer_args, nproc=1)
    cmd[cmd.index("--node_rank") + 1] = str(node)
    at = cmd.index("--")
    return [*cmd[:at], "--spare_nodes", "1", "--external_store", *cmd[at:]]


def run(cache_dir, cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env_for(cache_dir), capture_output=True, text=True,
                          timeout=stretched(120))


def failures(run_dir) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "worker_failed"]


def test_a_node_that_comes_after_the_end_exits_0_and_one_before_it_fails(cache_dir, tmp_path):
    pace(cache_dir)
    run_dir, port = tmp_path / "run", free_port_block()
    run_dir.mkdir()
    args = ("--max_steps", str(STEPS), "--checkpoint_interval", str(STEPS),
            *recovery_flags(cache_dir))
    store = start_store(LaunchSpec(MODE, 1, 1, 0, "127.0.0.1", port, spare_nodes=1,
                                   external_store=True), run_dir)
    try:
        ok(run(cache_dir, node_cmd(run_dir, port, 0, *args)))  # trains to the end, closes
        late = run(cache_dir, node_cmd(run_dir, port, 1, *args))
        assert late.returncode == 0, late.stdout[-2000:] + late.stderr[-3000:]
        assert (f"the run has ended (step {STEPS} of {STEPS} is committed in "
                f"{run_dir / 'checkpoints'}): this node has nothing to train") in late.stderr
        assert failures(run_dir) == []

        # A run whose end is not committed: on the c10d rendezvous (before 0.6) the closed
        # round is a real failure; the barrier rendezvous (0.6+) keeps the node as a standby,
        # which waits for a seat well past the launcher's look at the run's end
        early_cmd = node_cmd(run_dir, port, 1, *args[:1], str(STEPS + 2), *args[2:])
        if rendezvous_finds_silent_nodes():  # the c10d rendezvous
            early = run(cache_dir, early_cmd)
            assert early.returncode == 1, early.stdout[-2000:] + early.stderr[-3000:]
            assert "the run has ended" not in early.stderr
            assert [e["exit_code"] for e in failures(run_dir)] == [1]
        else:
            standby = start(early_cmd, cache_dir, run_dir)
            try:
                time.sleep(3 * END_POLL_S)
                assert standby.poll() is None, (run_dir / "test-output.log").read_text()[-3000:]
                assert failures(run_dir) == []
            finally:
                kill_group(standby)
            assert "the run has ended" not in (run_dir / "test-output.log").read_text()
    finally:
        store.terminate()
        store.wait(timeout=30)
