"""The launcher's shape of a run (nodes, spares, the smallest world, the store process): bad
values are one line and exit 2 before anything starts; good ones reach ft_launcher spelled for
the installed NVRx; the store process serves every port the run's stores use."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import timedelta

import pytest

from config.contract import app_store_port, wrapper_store_port
from tests.jobs import ROOT

LAUNCH = [sys.executable, "-m", "trainer.recovery.launch"]
BASE = ["--nproc_per_node", "1", "--master_addr", "127.0.0.1"]


def launch(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCH, *args, "--", "--checkpoint_dir", str(tmp_path / "ck")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, fragment", [
    (["--mode", "ft_launcher", "--nnodes", "2", "--min_nodes", "3", "--node_rank", "0"],
     "--min_nodes 3 must be in [1, 2]"),
    (["--mode", "ft_launcher", "--nnodes", "2", "--min_nodes", "0", "--node_rank", "0"],
     "--min_nodes 0 must be in [1, 2]"),
    (["--mode", "ft_launcher", "--nnodes", "2", "--spare_nodes", "-1", "--node_rank", "0"],
     "--spare_nodes -1 must be 0 or more"),
    (["--mode", "ft_launcher", "--nnodes", "2", "--spare_nodes", "1", "--node_rank", "3"],
     "--node_rank 3 must be in [0, 3)"),
    (["--mode", "baseline", "--nnodes", "2", "--spare_nodes", "1", "--node_rank", "0"],
     "--spare_nodes needs a launcher that restarts its workers"),
    (["--mode", "inprocess", "--nnodes", "2", "--min_nodes", "1", "--node_rank", "0"],
     "--min_nodes below --nnodes needs a launcher that restarts its workers"),
    (["--mode", "baseline", "--nnodes", "2", "--external_store", "--node_rank", "0"],
     "--external_store needs a launcher that restarts its workers"),
])
def test_bad_shapes_are_one_line_and_exit_2_before_anything_starts(tmp_path, args, fragment):
    proc = launch(tmp_path, *BASE, *args)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert fragment in last, last
    assert "launch:" not in proc.stdout  # nothing was started
    assert not (tmp_path / "ck").exists()


def test_a_shrink_the_global_batch_cannot_follow_is_refused(tmp_path):
    """3 nodes of one rank, the default batch of 4: a global batch of 12 is 6 a rank on 2 nodes.
    An NVRx whose ft_launcher keeps a fixed world refuses the shrink itself."""
    from trainer.nvrx_compat import shrinks_world

    proc = launch(tmp_path, *BASE, "--mode", "ft_launcher", "--nnodes", "3", "--min_nodes", "2",
                  "--node_rank", "0")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    fragment = ("--min_nodes 2 lets training shrink to 2 nodes, where the global batch size 12 "
                "cannot be kept at world size 2") if shrinks_world() else \
        "--min_nodes 2 below --nnodes 3: the installed NVRx keeps a fixed world"
    assert fragment in last, last
    assert "launch:" not in proc.stdout


def test_spares_and_a_shrinking_world_reach_ft_launcher():
    from trainer.recovery.launch import LaunchSpec, build_command, launch_env
    from trainer.nvrx_compat import nnodes_flag
    from trainer.recovery.stores import EXTERNAL_STORE_ENV

    spec = LaunchSpec("ft_launcher", 4, 8, 5, "store.svc", 29500, min_nodes=3, spare_nodes=2,
                      external_store=True, node_timeout=6, rdzv_last_call_timeout=10)
    cmd = build_command(spec, [])
    assert f"--nnodes={nnodes_flag(3, 4, 2)}" in cmd and "--node-rank=5" in cmd
    conf = next(a for a in cmd if a.startswith("--rdzv-conf="))
    assert "is_host=false" in conf  # node 0 hosts nothing with the store process
    assert "keep_alive_interval=2,keep_alive_max_attempt=3" in conf
    assert "last_call_timeout=10" in conf
    cfg = type("Cfg", (), {"output_dir": None, "collective_timeout": lambda self, d: 60.0,
                           "hard_timeout": 60.0})()
    assert launch_env(spec, cfg, base={})[EXTERNAL_STORE_ENV] == "store.svc:29500"
    plain = LaunchSpec("ft_launcher", 4, 8, 0, "job-0.svc", 29500)
    assert next(a for a in build_command(plain, []) if a.startswith("--rdzv-conf=")) == \
        "--rdzv-conf=join_timeout=600,is_host=true"  # as before: node 0 hosts
    assert EXTERNAL_STORE_ENV not in launch_env(plain, cfg, base={})


def test_store_process_serves_every_port_and_exits_0_on_sigterm():
    import torch.distributed as dist

    from devtools.local import free_port_block

    port = free_port_block()
    proc = subprocess.Popen([sys.executable, "-m", "trainer.recovery.store_server",
                             "--master_port", str(port), "--host", "127.0.0.1", "--nnodes", "2",
                             "--spare_nodes", "1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline()
        assert "serving the run's stores" in ready, proc.stderr.read() if proc.poll() else ready
        for p in (port, wrapper_store_port(port), app_store_port(port)):
            store = dist.TCPStore("127.0.0.1", p, is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=30))
            store.set("k", str(p))
            assert store.get("k") == str(p).encode()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_store_process_closes_the_rounds_the_launchers_join(monkeypatch):
    """From NVRx 0.6 the store's host closes each rendezvous round: the store process runs
    NVRx's closer with exactly the launchers' rendezvous flags; before 0.6 a plain store does."""
    from trainer import nvrx_compat
    from trainer.recovery import store_server
    from trainer.recovery.launch import LaunchSpec, build_command, rendezvous_flags, spec_rendezvous

    spec = LaunchSpec("ft_launcher", 4, 8, 0, "127.0.0.1", 29500, rdzv_id="run-7",
                      rdzv_join_timeout=900, spare_nodes=2, external_store=True,
                      node_timeout=9, rdzv_last_call_timeout=5)
    argv = ["--master_port", "29500", "--host", "127.0.0.1", *spec_rendezvous(spec)]
    for release, closes in (((0, 4), False), ((0, 6), True), ((0, 7), True)):
        monkeypatch.setattr(nvrx_compat, "NVRX_VERSION", release)
        closer = store_server.closer_argv(store_server.parse(argv))
        if not closes:
            assert closer is None
            continue
        assert closer[:3] == [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.control_plane"]
        flags = rendezvous_flags(spec)
        assert closer[3:3 + len(flags)] == flags
        launcher = build_command(spec, [])
        assert all(f in launcher for f in flags)  # the launchers join what the closer closes
        assert "--nnodes=4:6" in flags and "--rdzv-id=run-7" in flags


@pytest.mark.parametrize("flag, value", [("--nnodes", "0"), ("--rdzv_join_timeout", "0"),
                                         ("--node_timeout", "0.5")])
def test_the_store_process_refuses_a_bad_rendezvous_flag(flag, value):
    base = {"--nnodes": "2", "--rdzv_join_timeout": "600", "--node_timeout": "6"}
    argv = [a for k, v in (base | {flag: value}).items() for a in (k, v)]
    proc = subprocess.run([sys.executable, "-m", "trainer.recovery.store_server", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert f"{flag} {value}" in lines[-1] and "error" in lines[-1]


@pytest.mark.parametrize("mode", ("ft_launcher", "ft_launcher+inprocess"))
def test_the_installed_ft_launcher_parses_every_flag_the_launcher_gives_it(mode):
    """Read by NVRx's own parser: a flag it renames or drops fails here, not at a pod's start.
    Where it waits for a stopped worker's GPU memory (0.7), it samples at GPU_MEMORY_POLL_S."""
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

    from trainer.recovery.launch import LaunchSpec, build_command
    from trainer.nvrx_compat import GPU_MEMORY_POLL_S

    spec = LaunchSpec(mode, 2, 8, 0, "127.0.0.1", 29500, rdzv_id="run-7")
    argv = build_command(spec, ["--max_steps", "4"])
    assert argv[1:3] == ["-m", "trainer.recovery.forkserver"]
    args = get_args_parser().parse_args(argv[3:])  # exits 2 on a flag it does not know
    assert args.training_script_args[-2:] == ["--max_steps", "4"]
    if hasattr(FaultToleranceConfig, "gpu_memory_poll_interval"):
        assert float(args.ft_gpu_memory_poll_interval) == GPU_MEMORY_POLL_S
