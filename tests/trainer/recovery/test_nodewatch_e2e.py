"""A frozen node found by its neighbour's watch (`trainer.recovery.nodewatch`), end to end: the
ranks of one simulated node are stopped with SIGSTOP (a machine that hangs, its connections
open); the other node's first rank sees its beat stop, leaves, and the spare takes the silent
node's seat. NVRx 0.6+ needs the watch (its rendezvous keeps no keep-alive); here the heartbeat
and the collective timeout are set far beyond it, and the installed NVRx's keep-alive six
times beyond it, so only the watch can find the node in time. NVRx 0.4's rendezvous still
holds the silent node's seat until its keep-alive expires: the spare is seated then."""

from __future__ import annotations

import signal

from devtools.local import node_processes
from tests.jobs import events, kill_group, results, start_local, stretched, wait_for
from trainer.recovery.nodewatch import NODE_TIMEOUT_ENV

STEPS = 16
TIERS = ["--tiers", "memory,node,peer", "--snapshot_interval", "1"]


def test_a_frozen_node_is_found_by_its_neighbours_watch_and_a_spare_takes_its_place(
        cache_dir, pace, reference, tmp_path):
    run_dir = tmp_path / "run"
    far = f"{pace.seconds(120):g}"
    keep_alive = f"{pace.seconds(24):g}"
    job = start_local(cache_dir, "ft_launcher", run_dir, "--max_steps", str(STEPS),
                      "--checkpoint_interval", "4", *TIERS, *pace.recovery_flags(),
                      "--nccl_timeout", far, nproc=1,
                      local_args=("--nnodes", "2", "--spare_nodes", "1",
                                  *pace.runner_flags("ft_launcher"), "--heartbeat_timeout", far,
                                  "--node_timeout", keep_alive,
                                  "--node_return_s", "-1"),
                      extra_env={NODE_TIMEOUT_ENV: f"{pace.seconds(4):g}"})
    frozen = []
    try:
        wait_for(lambda: any(e["event"] == "step" and e["step"] >= 6 for e in events(run_dir)),
                 timeout=stretched(240), what="six steps")
        frozen = node_processes(job.pid, 1)
        for p in frozen:
            p.send_signal(signal.SIGSTOP)
        wait_for(lambda: any(e["event"] == "train_end" for e in events(run_dir)),
                 timeout=stretched(240), what="the end of training on the spare")
        for p in frozen:  # the machine that hung may go now
            p.kill()
        rc = job.wait(timeout=stretched(120))
    except BaseException:
        for p in frozen:
            p.kill()
        kill_group(job)
        raise
    out = (run_dir / "test-output.log").read_text()
    assert rc == 0, f"exit {rc}\n{out[-4000:]}"
    ev = events(run_dir)
    (silent,) = [e for e in ev if e["event"] == "node_silent"]
    assert (silent["rank"], silent["node"], silent["ranks"]) == (0, 1, [1])
    assert not [e for e in ev if e["event"] == "nodes_lost" and e["t"] < silent["t"]]
    loads = {e["rank"]: e["tier"] for e in ev
             if e["event"] in ("snapshot_load", "ckpt_load") and e["t"] > silent["t"]}
    assert loads == {0: "node", 1: "peer"}  # the spare holds rank 1 again, from its peer
    res = results(run_dir, signalled=True)
    assert res["steps_completed"] == STEPS
    assert res["param_sha256"] == reference(steps=STEPS, nproc=2)["param_sha256"]
    (fault,) = res["faults"]
    assert (fault["detection"], fault["failed_ranks"]) == ("node_lost", [1])
