"""The local runner's launcher environment matches the manifests' where recovery depends on it."""

import pytest

from config.contract import MODE_NAMES, RecoveryMode, nccl_heartbeat_timeout_s, process_env
from devtools.local import _launcher_env
from trainer.config import parse_args
from trainer.recovery.launch import LaunchSpec, launch_env

WATCHDOG_ENV = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ENABLE_MONITORING",
                "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_RETHROW_CUDA_ERRORS",
                "NCCL_NVLS_ENABLE", "TORCH_CPP_LOG_LEVEL")


def _cfg(mode: str, *flags: str):
    return parse_args(["--mode", mode, "--device", "cpu", *flags])


@pytest.fixture
def clean_env(monkeypatch):
    for name in WATCHDOG_ENV:
        monkeypatch.delenv(name, raising=False)


def test_local_launchers_bound_the_nccl_watchdog_like_the_manifests(tmp_path, clean_env):
    """Without it PyTorch waits up to 480 s on a watchdog stuck after a collective timeout
    (in its debug dump), and a hang in the baseline can outlast any restart budget."""
    bound = nccl_heartbeat_timeout_s(nccl_timeout_s=20, hard_timeout_s=30)
    assert 30 < bound < 480
    cfg = _cfg("baseline", "--nccl_timeout", "20", "--soft_timeout", "10", "--hard_timeout", "30")
    env = _launcher_env(LaunchSpec("baseline", 1, 2, 0, "127.0.0.1"), tmp_path / "final", cfg)
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == str(bound)
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "1"


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_local_processes_react_to_nccl_errors_as_the_mode_needs(tmp_path, clean_env, mode):
    """In-process restart needs a failed collective to raise in the rank (2), every other mode
    needs the process to die (3); the values the manifests set (tests/k8s)."""
    env = _launcher_env(LaunchSpec(mode, 1, 2, 0, "127.0.0.1"), tmp_path / "final", _cfg(mode))
    in_process = RecoveryMode(mode).in_process
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == ("2" if in_process else "3")
    assert env.get("TORCH_NCCL_RETHROW_CUDA_ERRORS") == ("0" if in_process else None)
    assert env.get("NCCL_NVLS_ENABLE") == ("0" if in_process else None)
    assert env["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    assert env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_values_the_environment_already_has_win(mode):
    """A pod's manifest sets the same variables; the launcher must not override them."""
    cfg = _cfg(mode)
    preset = {name: "preset" for name in process_env(mode, 60, 60)}
    env = launch_env(LaunchSpec(mode, 1, 2, 0, "127.0.0.1"), cfg, base=preset)
    assert {name: env[name] for name in preset} == preset


def test_a_port_block_is_free_and_below_the_kernels_ephemeral_range():
    """A port the kernel may give any outgoing connection could be taken before the launcher
    binds it."""
    import socket

    from devtools.local import _ephemeral_low, free_port_block

    base = free_port_block(3)
    assert 1024 <= base and base + 3 <= _ephemeral_low()
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        for s, port in zip((a, b, c), range(base, base + 3)):
            s.bind(("127.0.0.1", port))
