"""What infra, manifests and trainer must agree on, in one torch-free module.

- Kubernetes conventions of the GPU node group: its label, its taint, the huge pages it
  pre-allocates, the FSx claim and the stack output keys the manifests read.
- The recovery modes: one enum, and for each mode the launcher it runs and the recovery layers
  it uses. Code asks a mode what it does; it never tests its name.
- The environment of the training processes per mode (`process_env`): the pods set it in their
  manifest, the launcher (in the pods and locally) fills in what a pod left unset.
- The launcher's ports (its metrics port too) and the variables through which it talks to its
  ranks.
- The host-memory rule of the snapshot tiers (how many shard-sized slots one rank keeps).

Only the standard library is imported here: the CDK app, `python -m k8s` and the trainer all
import it, and an install without torch must still synthesize and submit.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

# --- GPU node group ---------------------------------------------------------------------------
NODE_GROUP_LABEL_KEY = "nvrx-eks/node-group"
NODE_GROUP_GPU = "gpu"
NODE_GROUP_SYSTEM = "system"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "true"
GPU_TAINT_EFFECT = "NoSchedule"

# Each training pod requests `hugepages-2Mi: 5120Mi` (libfabric's EFA provider and the NCCL OFI
# plugin register bounce buffers from 2 MiB pages). One training pod runs per node; nodes reserve
# room for two so that a replacement pod is admitted while the old one is still terminating.
HUGEPAGES_2MI_PER_POD_MIB = 5120
TRAINING_PODS_PER_NODE = 1
# The private subnets of a new VPC, the GPU nodes' among them: every pod gets a VPC address.
PRIVATE_SUBNET_PREFIX = 19
HUGEPAGES_POD_HEADROOM = 2
NR_HUGEPAGES_2MI = HUGEPAGES_2MI_PER_POD_MIB // 2 * TRAINING_PODS_PER_NODE * HUGEPAGES_POD_HEADROOM

# Pods leave a node that stopped answering after this long, instead of Kubernetes' default 300 s.
# The node is tainted only once it has been silent for the node monitor's grace period (40-50 s),
# so a few seconds more suffice: a lost pod's replacement is created on eviction (ft_launcher
# modes) and a gang restart (torchrun modes) cannot begin before the lost node's pod is gone.
NODE_LOSS_TOLERATION_S = 10

# --- Storage and stack outputs ------------------------------------------------------------------
FSX_PVC_NAME = "fsx-claim"
OUTPUT_CLUSTER_NAME = "ClusterName"
OUTPUT_KUBECONFIG_COMMAND = "KubeconfigCommand"
OUTPUT_REGION = "Region"
OUTPUT_NAMESPACE = "Namespace"
OUTPUT_FSX_PVC_NAME = "FsxPvcName"
OUTPUT_ECR_REPOSITORY_URI = "EcrRepositoryUri"
OUTPUT_NODE_LOCAL_DIR = "NodeLocalDir"


# --- Recovery modes -----------------------------------------------------------------------------
class Launcher(enum.StrEnum):
    TORCHRUN = "torchrun"
    FT_LAUNCHER = "ft_launcher"

    @property
    def restarts_workers(self) -> bool:
        """ft_launcher restarts a failed worker group within the pod; torchrun runs with
        `--max-restarts 0`: a process death ends its pod."""
        return self is Launcher.FT_LAUNCHER


@dataclass(frozen=True)
class ModeTraits:
    """What one recovery mode runs, and which recovery layers it relies on."""

    launcher: Launcher
    in_process: bool  # NVRx inprocess.Wrapper re-enters the training function
    heartbeats: bool  # ranks heartbeat to ft_launcher's rank monitors
    description: str


class RecoveryMode(enum.StrEnum):
    """The recovery modes. Every mode also relies on the job-level restart (the Kubernetes Job)
    for what its inner layers cannot handle: a lost node or an exhausted restart budget."""

    BASELINE = "baseline"
    FT_LAUNCHER = "ft_launcher"
    INPROCESS = "inprocess"
    FT_LAUNCHER_INPROCESS = "ft_launcher+inprocess"

    @property
    def traits(self) -> ModeTraits:
        return _TRAITS[self]

    @property
    def launcher(self) -> Launcher:
        return self.traits.launcher

    @property
    def uses_ft_launcher(self) -> bool:
        return self.traits.launcher is Launcher.FT_LAUNCHER

    @property
    def in_process(self) -> bool:
        return self.traits.in_process

    @property
    def heartbeats(self) -> bool:
        return self.traits.heartbeats

    @property
    def launcher_restarts_workers(self) -> bool:
        return self.traits.launcher.restarts_workers

    @property
    def recovers_within_job(self) -> bool:
        """Some layer inside the Job recovers from a fault: the Wrapper re-enters the training
        function, or the launcher restarts the workers. Without one (baseline), every fault ends
        the pods and the Job (locally, `devtools.local`) restarts all of them; such a mode is the
        published baseline and keeps durable checkpoints only."""
        return self.in_process or self.launcher_restarts_workers

    @property
    def heartbeat_outlasts_hard_timeout(self) -> bool:
        """ft_launcher's rank heartbeat timeout must exceed the Wrapper's hard timeout: with
        in-process restart below the launcher, a rank the Wrapper is still recovering sends no
        heartbeats, and the launcher must not kill it for that."""
        return self.heartbeats and self.in_process

    @property
    def job_restart(self) -> bool:
        """The job-level restart is the outermost layer of every mode."""
        return True

    @property
    def slug(self) -> str:
        """As a DNS-label fragment and label value: 'ft_launcher+inprocess' -> 'ft-launcher-inprocess'."""
        return self.value.replace("_", "-").replace("+", "-")

    @classmethod
    def parse(cls, name: str) -> "RecoveryMode":
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"mode {name!r} is not one of {', '.join(MODE_NAMES)}") from None


_TRAITS: dict[RecoveryMode, ModeTraits] = {
    RecoveryMode.BASELINE: ModeTraits(
        Launcher.TORCHRUN, False, False, "any fault ends the process; the Job restarts every pod"),
    RecoveryMode.FT_LAUNCHER: ModeTraits(
        Launcher.FT_LAUNCHER, False, True, "dead or silent ranks: the launcher restarts the workers"),
    RecoveryMode.INPROCESS: ModeTraits(
        Launcher.TORCHRUN, True, False, "exceptions and hangs re-enter the training function"),
    RecoveryMode.FT_LAUNCHER_INPROCESS: ModeTraits(
        Launcher.FT_LAUNCHER, True, True, "in-process first, the launcher for process deaths"),
}
MODE_NAMES: tuple[str, ...] = tuple(m.value for m in RecoveryMode)


# --- Launcher ports and the launcher's variables -------------------------------------------------
# From the launcher's --master_port P: P the launcher's rendezvous store (torchrun's and
# ft_launcher's TCPStore), P+1 the in-process Wrapper's store, P+2 the in-process application
# store (one store; each attempt uses its own prefix in it).
# Seconds between SIGTERM and SIGKILL at the least (the pod's terminationGracePeriodSeconds, the
# trainer's --termination_grace): the time to finish a step and exit; a large checkpoint adds its
# write time (config.grace).
TERMINATION_GRACE_FLOOR_S = 120

DEFAULT_MASTER_PORT = 29500
PORTS_PER_JOB = 3
INPROCESS_PORT_ENV = "NVRX_EKS_INPROCESS_PORT"  # the Wrapper's store port, set by the launcher
FINAL_ERROR_ENV = "NVRX_EKS_FINAL_ERROR_FILE"  # where a rank records an error no restart fixes
# The event log (trainer.accounting.events): the node whose file a process appends to (the
# launcher's --node_rank, stable across restarts), the run's events directory (for the launcher
# itself), and which start of the launcher its workers belong to (a new one: a job restart).
NODE_RANK_ENV = "NVRX_EKS_NODE_RANK"
EVENTS_DIR_ENV = "NVRX_EKS_EVENTS_DIR"
LAUNCHER_ID_ENV = "NVRX_EKS_LAUNCHER_ID"
RDZV_ROUND_ENV = "NVRX_EKS_RDZV_ROUND"  # the rendezvous round a worker group joined (ft_launcher)
# Prometheus metrics (trainer.telemetry.exporter): each node's launcher serves /metrics on this
# port from the figures file its workers publish (FIGURES_FILE_ENV, set by the launcher); the
# manifests open the port to the monitoring namespace's scraper and annotate it.
METRICS_PORT = 9470
METRICS_PATH = "/metrics"
FIGURES_FILE_ENV = "NVRX_EKS_FIGURES_FILE"


def wrapper_store_port(master_port: int) -> int:
    return master_port + 1


def _app_store_after(wrapper_port: int) -> int:
    return wrapper_port + 1


def app_store_port(master_port: int) -> int:
    return _app_store_after(wrapper_store_port(master_port))


def inprocess_ports(environ: Mapping[str, str]) -> tuple[int, int]:
    """A rank's (Wrapper store, application store) ports: after the launcher's
    INPROCESS_PORT_ENV, else after MASTER_PORT (a rank started by torchrun directly)."""
    if INPROCESS_PORT_ENV in environ:
        wrapper = int(environ[INPROCESS_PORT_ENV])
    else:
        wrapper = wrapper_store_port(int(environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)))
    return wrapper, _app_store_after(wrapper)


def rendezvous_argv(nnodes: int, join_timeout_s: float, *, min_nodes: int | None = None,
                    spare_nodes: int | None = None, rdzv_id: str | None = None,
                    node_timeout_s: float | None = None,
                    last_call_timeout_s: float | None = None) -> list[str]:
    """The rendezvous flags that the node's launcher (`trainer.recovery.launch`) and the store
    process that closes its rounds (`trainer.recovery.store_server`) both take: written here
    alone, by the manifests and by a launcher for its store process. A flag given as None is
    left out, at the parser's default."""
    flags = {"--nnodes": nnodes, "--min_nodes": min_nodes, "--spare_nodes": spare_nodes,
             "--rdzv_id": rdzv_id, "--rdzv_join_timeout": float(join_timeout_s),
             "--node_timeout": node_timeout_s, "--rdzv_last_call_timeout": last_call_timeout_s}
    argv: list[str] = []
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return argv


# --- Snapshot tiers: host memory ----------------------------------------------------------------
SNAPSHOT_SLOTS = 2  # own snapshot slots: double buffering
PEER_SLOTS = 2  # replica slots: the previous replica stays valid while the next arrives


def nccl_heartbeat_timeout_s(nccl_timeout_s: float, hard_timeout_s: float) -> int:
    """PyTorch's watchdog-of-the-watchdog (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC): it must never fire
    before a collective timeout or the Wrapper's hard timeout has had its chance, and it bounds
    a watchdog stuck after a timeout (in its debug dump, say), which by default may take 480 s."""
    return math.ceil(2 * max(nccl_timeout_s, hard_timeout_s))


def process_env(mode: RecoveryMode | str, nccl_timeout_s: float,
                hard_timeout_s: float) -> dict[str, str]:
    """The environment of every training process in this mode: PyTorch's reaction to a NCCL
    error and its watchdog's bound. The pods set it in their manifest; the launcher sets what a
    pod left unset (`trainer.recovery.launch.launch_env`), so local runs get the same."""
    mode = RecoveryMode(mode)
    env = {
        # 3: tear the process down on a NCCL error or timeout (the Job or the launcher restarts
        # it); 2: only abort the communicator, so the error surfaces as an exception that the
        # in-process Wrapper catches and restarts from (NVRx's "the watchdog must not kill the
        # process before hard_timeout" then holds even though nccl_timeout < hard_timeout).
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2" if mode.in_process else "3",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(nccl_heartbeat_timeout_s(nccl_timeout_s,
                                                                         hard_timeout_s)),
        # Stores are polled with timeouts (the fail-fast watcher, the Wrapper); each timeout
        # would log a warning and drown the log.
        "TORCH_CPP_LOG_LEVEL": "ERROR",
    }
    if mode.in_process:
        # NVRx known issues: NVLink SHARP buffers are not released by a communicator abort, and
        # a CUDA error rethrown in the watchdog kills the process the Wrapper would restart.
        env["NCCL_NVLS_ENABLE"] = "0"
        env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] = "0"
    return env


def own_slots(peer: bool, durable: bool) -> int:
    """Two slots alternate. With a peer, one more keeps the snapshot last sent to it: survivors
    must still hold the step their peers' replicas hold, or no step is complete after a node
    loss. With durable checkpoints, one more is read by the background write, which can take
    many steps: without it, one slot would be left and every snapshot would overwrite the
    newest complete one."""
    return SNAPSHOT_SLOTS + (1 if peer else 0) + (1 if durable else 0)


def snapshot_bytes(shard_bytes: int, peer: bool, durable: bool) -> int:
    """Host memory the tiers need per rank: own slots, plus replica slots with a peer. With the
    tiers, durable checkpoints are written from a slot: no staging buffer besides."""
    return shard_bytes * (own_slots(peer, durable) + (PEER_SLOTS if peer else 0))


# --- Export ---------------------------------------------------------------------------------------
# `python -m trainer.export` and the export Job (`nvrx-eks export`) agree on its choices and on
# where an export of a run lands: `<run dir>/export/<name>`, named after what it holds.
EXPORT_FORMATS = ("hf", "dcp")
EXPORT_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # choice -> torch dtype name
EXPORT_DTYPE_DEFAULT = "fp32"  # what training keeps: the export is exact
EXPORT_DIR = "export"
# The most bytes of weights one safetensors file of an `hf` export holds (a larger parameter
# gets a file of its own). The export holds one file's tensors in memory at a time: this
# bounds its memory, and the export Job's request.
EXPORT_FILE_BYTES = 2 * 10**9


def export_name(fmt: str, step: int | str, dtype: str = EXPORT_DTYPE_DEFAULT) -> str:
    """`hf-step500`, `dcp-step500`; `hf-bf16-step500` for another dtype than training's, so
    exports of one step in two dtypes never meet. (`step` "<N>": the name before the step is
    known, as the wrapper shows it.)"""
    kind = fmt if dtype == EXPORT_DTYPE_DEFAULT else f"{fmt}-{dtype}"
    return f"{kind}-step{step}"
