"""Container environment: rank identity, the home and token paths, NCCL/EFA and PyTorch NCCL knobs.

Network settings follow the instance table (EFA count, GPUDirect RDMA); the PyTorch watchdog
settings follow the recovery mode and the profile's timeouts, by the contract's one rule
(`config.contract.process_env`), which the launcher applies to local runs as well.
"""

from __future__ import annotations

from cdk8s_plus_35 import k8s

from config import InstanceSpec, contract
from k8s import naming
from k8s.deployment import HF_TOKEN_MOUNT, SCRATCH_MOUNT, Deployment

# Where the EFA installer puts aws-ofi-nccl in the Ubuntu image (the Dockerfile checks it exists).
OFI_NCCL_LIB_DIR = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"
NCCL_TUNER_PLUGIN_PATH = f"{OFI_NCCL_LIB_DIR}/libnccl-ofi-tuner.so"
# The name aws-ofi-nccl registers its network under. NCCL_NET makes NCCL use that network or
# fail at start-up: without it a missing or broken plugin silently falls back to TCP sockets.
# The image's build-time smoke test reads this name out of the plugin (Dockerfile).
OFI_NCCL_NET = "AWS Libfabric"


def network_env(spec: InstanceSpec) -> dict[str, str]:
    """NCCL/libfabric settings for one instance family."""
    env = {
        # Bootstrap and TCPStore over the pod's eth0, never loopback or bridges.
        "NCCL_SOCKET_IFNAME": "^lo,docker,veth",
        # INIT,NET shows "Selected provider is efa" once per rank: proof that EFA is in use.
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
    }
    if spec.efa_interfaces:
        env.update(
            {
                "FI_PROVIDER": "efa",
                "FI_EFA_FORK_SAFE": "1",  # data loader workers fork after memory registration
                "NCCL_NET": OFI_NCCL_NET,
                "NCCL_TUNER_PLUGIN": NCCL_TUNER_PLUGIN_PATH,
            }
        )
        if spec.gpudirect_rdma:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    else:
        # No EFA: use NCCL's own sockets rather than letting aws-ofi-nccl pick libfabric's tcp.
        env["NCCL_NET"] = "Socket"
    return env


def recovery_env(dep: Deployment) -> dict[str, str]:
    """PyTorch NCCL watchdog behaviour matching the recovery mode and the trainer's timeouts."""
    train = dep.train
    return contract.process_env(dep.recovery_mode, train.collective_timeout("cuda"),
                                train.hard_timeout)


def run_env(dep: Deployment) -> dict[str, str]:
    return {
        "NVRX_RUN_ID": dep.run_id,
        "NVRX_RUN_DIR": dep.run_dir,
        "PYTHONUNBUFFERED": "1",
    }


def completion_index_env() -> k8s.EnvVar:
    """Node rank = completion index; `$(JOB_COMPLETION_INDEX)` in args expands from this."""
    path = f"metadata.annotations['{naming.COMPLETION_INDEX_KEY}']"
    return k8s.EnvVar(
        name=naming.COMPLETION_INDEX_ENV,
        value_from=k8s.EnvVarSource(field_ref=k8s.ObjectFieldSelector(field_path=path)),
    )


def files_env() -> dict[str, str]:
    """Where a container with a read-only root writes and finds its files: HOME on the scratch
    volume, so every `~/.cache` (Hugging Face, Triton, CUDA's JIT cache) lands there, and the
    Hugging Face token as the mounted Secret's file, which huggingface_hub reads through
    HF_TOKEN_PATH (the token itself is never in the environment)."""
    return {"HOME": SCRATCH_MOUNT, "HF_TOKEN_PATH": f"{HF_TOKEN_MOUNT}/{naming.HF_TOKEN_KEY}"}


def as_env_vars(values: dict[str, str]) -> list[k8s.EnvVar]:
    return [k8s.EnvVar(name=name, value=value) for name, value in values.items()]


def training_env(dep: Deployment) -> list[k8s.EnvVar]:
    plain = {**run_env(dep), **files_env(), **network_env(dep.instance), **recovery_env(dep)}
    return [completion_index_env(), *as_env_vars(plain)]


def data_prep_env() -> list[k8s.EnvVar]:
    return as_env_vars({**files_env(), "PYTHONUNBUFFERED": "1"})
