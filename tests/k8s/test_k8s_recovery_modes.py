"""Per-mode restart settings: Job-level policy, launcher flags and the NCCL watchdog environment."""

from __future__ import annotations

import pytest

from k8s import naming
from k8s.environment import network_env
from k8s.restart_policy import USAGE_ERROR_EXIT_CODE


def test_job_level_restart_policy(synthesis) -> None:
    spec = synthesis.job["spec"]
    rec, nodes = synthesis.dep.profile.recovery, synthesis.dep.profile.node_count
    assert synthesis.pod_spec["restartPolicy"] == "Never"
    assert spec["backoffLimit"] == rec.backoff_limit * nodes  # one gang restart fails every pod
    assert "backoffLimitPerIndex" not in spec
    if synthesis.dep.recovery_mode.launcher_restarts_workers:
        # a lost pod's replacement starts at once and joins as a spare (test_k8s_spares)
        assert spec["podReplacementPolicy"] == "TerminatingOrFailed" and "podFailurePolicy" not in spec
        return
    assert spec["podReplacementPolicy"] == "Failed"
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert rules[1]["action"] == "FailJob"
    assert rules[1]["onExitCodes"] == {"containerName": "trainer", "operator": "In", "values": [USAGE_ERROR_EXIT_CODE]}


def test_launcher_flags_per_mode(synthesis) -> None:
    rec = synthesis.dep.profile.recovery
    assert synthesis.trainer["command"] == ["python", "-m", "trainer.recovery.launch"]
    assert synthesis.args_value("--mode") == synthesis.dep.mode
    # torchrun runs with --max-restarts 0: only ft_launcher gets a worker restart budget
    expected_restarts = rec.max_restarts if synthesis.dep.recovery_mode.uses_ft_launcher else 0
    assert synthesis.args_value("--max_restarts") == str(expected_restarts)
    assert float(synthesis.args_value("--heartbeat_timeout")) == rec.heartbeat_timeout_s
    assert float(synthesis.args_value("--initial_heartbeat_timeout")) == rec.initial_heartbeat_timeout_s
    assert float(synthesis.args_value("--monitor_interval")) == rec.monitor_interval_s
    args = synthesis.trainer["args"]
    assert args.count("--") == 1 and args.index("--") > args.index("--monitor_interval")


def test_watchdog_environment_per_mode(synthesis) -> None:
    env = {name: e.get("value") for name, e in synthesis.env.items()}
    train = synthesis.dep.train
    nccl_timeout_s, hard_timeout_s = train.collective_timeout("cuda"), train.hard_timeout
    if synthesis.dep.recovery_mode.in_process:
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
        assert env["NCCL_NVLS_ENABLE"] == "0"
        assert env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "0"
        assert nccl_timeout_s < hard_timeout_s
    else:
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
        assert "NCCL_NVLS_ENABLE" not in env
        assert "TORCH_NCCL_RETHROW_CUDA_ERRORS" not in env
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    assert env["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    assert int(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) > max(nccl_timeout_s, hard_timeout_s)


def test_pod_environment_and_launcher_environment_agree(synthesis) -> None:
    """The launcher in the pod (and the local runner, which starts workers the same way) sets
    what the manifest left unset; for every PyTorch/NCCL knob it sets, the manifest already has
    the same value, and the manifest sets no such knob a local run would lack."""
    from trainer.config import parse_args
    from trainer.recovery.launch import launch_env, parse

    args = [a.replace(f"$({naming.COMPLETION_INDEX_ENV})", "0") for a in synthesis.trainer["args"]]
    spec, trainer_args = parse(args)
    cfg = parse_args([*trainer_args, "--mode", spec.mode])
    pod = {name: e["value"] for name, e in synthesis.env.items() if "value" in e}
    local = launch_env(spec, cfg, base={})

    def knobs(env: dict) -> dict:
        return {k: v for k, v in env.items() if k.startswith(("TORCH_", "NCCL_"))
                and k not in network_env(synthesis.dep.instance)}

    assert knobs(local) == knobs(pod)
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in knobs(local)
    in_pod = launch_env(spec, cfg, base=pod)
    assert {k: in_pod[k] for k in pod} == pod  # the manifest's values win


def test_efa_environment_per_family(synthesis) -> None:
    env = {name: e.get("value") for name, e in synthesis.env.items()}
    spec = synthesis.dep.instance
    if spec.efa_interfaces:
        assert env["FI_PROVIDER"] == "efa"
        assert env["FI_EFA_FORK_SAFE"] == "1"
        assert env["NCCL_TUNER_PLUGIN"].endswith("libnccl-ofi-tuner.so")
        assert ("FI_EFA_USE_DEVICE_RDMA" in env) == spec.gpudirect_rdma
    else:
        assert env["NCCL_NET"] == "Socket"
    if spec.gpudirect_rdma:
        assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"


@pytest.mark.parametrize("profile", ["p5", "p4de"])
def test_gpudirect_rdma_on_p_families(synth_for, profile: str) -> None:
    env = synth_for(profile, "baseline").env
    assert env["FI_EFA_USE_DEVICE_RDMA"]["value"] == "1"
