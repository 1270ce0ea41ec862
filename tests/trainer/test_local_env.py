"""The local runner's launcher environment matches the manifests' where recovery depends on it."""

from config.contract import nccl_heartbeat_timeout_s
from trainer.recovery.launch import LaunchSpec
from devtools.local import _launcher_env


def test_local_launchers_bound_the_nccl_watchdog_like_the_manifests(tmp_path, monkeypatch):
    """Without it PyTorch waits up to 480 s on a watchdog stuck after a collective timeout
    (in its debug dump), and a hang in the baseline can outlast any restart budget."""
    monkeypatch.delenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", raising=False)
    bound = nccl_heartbeat_timeout_s(nccl_timeout_s=20, hard_timeout_s=30)
    assert 30 < bound < 480
    env = _launcher_env(LaunchSpec("baseline", 1, 2, 0, "127.0.0.1", 29500), tmp_path / "final",
                        bound)
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == str(bound)
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
