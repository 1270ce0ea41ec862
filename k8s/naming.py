"""Names, labels, ports and cluster conventions shared by every manifest and by the wrapper.

One module so the charts, the wrapper's label selectors and the infra contract (node labels,
taint, hugepages) cannot drift apart.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from config import contract
from config.contract import RecoveryMode
from k8s.errors import SynthError

# Labels on every object we create; the wrapper's `cleanup` selects on PART_OF.
LABEL_PART_OF = "app.kubernetes.io/part-of"
PART_OF = "nvrx-eks"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_RUN_ID = "nvrx-eks/run-id"
LABEL_MODE = "nvrx-eks/mode"
COMPONENT_TRAIN = "train"
COMPONENT_DATA_PREP = "data-prep"
COMPONENT_RESULTS = "results"
COMPONENT_WATCH = "watch"
COMPONENT_EXPORT = "export"
COMPONENT_STORE = "store"
COMPONENT_PREPULL = "prepull"

# Set by the Job controller on Indexed Job pods (label since 1.28, annotation since 1.21).
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"

# Contract with the infra stacks (GPU node group): config/contract.py.
NODE_GROUP_LABEL = contract.NODE_GROUP_LABEL_KEY
NODE_GROUP_GPU = contract.NODE_GROUP_GPU
NODE_GROUP_SYSTEM = contract.NODE_GROUP_SYSTEM
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_TAINT_KEY = contract.GPU_TAINT_KEY
GPU_TAINT_VALUE = contract.GPU_TAINT_VALUE
GPU_TAINT_EFFECT = contract.GPU_TAINT_EFFECT
# Taints the node lifecycle controller puts on a node that stops reporting.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"

# Extended resources advertised by the NVIDIA and EFA device plugins.
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
HUGEPAGES_RESOURCE = "hugepages-2Mi"
EFA_HUGEPAGES_MIB = contract.HUGEPAGES_2MI_PER_POD_MIB  # pre-allocated per pod by the GPU nodes
EFA_HUGEPAGES = f"{EFA_HUGEPAGES_MIB}Mi"

# Fixed object names shared by all runs of a namespace.
SERVICE_ACCOUNT = "nvrx-trainer"
DATA_PREP_JOB = "data-prep"
HF_TOKEN_SECRET = "hf-token"
HF_TOKEN_KEY = "token"
TRAINER_CONTAINER = "trainer"
EXPORT_CONTAINER = "export"

# Ports between training pods (contract with the trainer's launcher).
RENDEZVOUS_PORT = contract.DEFAULT_MASTER_PORT  # torchrun / ft_launcher rendezvous and TCPStore
INPROCESS_WRAPPER_PORT = contract.wrapper_store_port(RENDEZVOUS_PORT)  # the NVRx Wrapper's store
INPROCESS_APP_PORT = contract.app_store_port(RENDEZVOUS_PORT)  # the in-process application store
METRICS_PORT = contract.METRICS_PORT  # each training pod's Prometheus /metrics (its launcher)
# The stores on those ports, by port name: served by node rank 0's launcher (torchrun modes) or
# by the run's store pod (ft_launcher modes).
STORE_PORTS = (
    ("rendezvous", RENDEZVOUS_PORT),
    ("inproc-wrapper", INPROCESS_WRAPPER_PORT),
    ("inproc-app", INPROCESS_APP_PORT),
)
METRICS_PORT_NAME = "metrics"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_LABEL_MAX = 63
TRAIN_PREFIX = "train-"
STORE_SUFFIX = "-store"
PREPULL_DAEMONSET = "prepull-trainer-image"
RESULTS_PREFIX = "results-"
WATCH_PREFIX = "watch-"
EXPORT_PREFIX = "export-"


def mode_slug(mode: str) -> str:
    """A recovery mode as a DNS-label fragment and label value ('ft_launcher+inprocess' -> 'ft-launcher-inprocess')."""
    return RecoveryMode.parse(mode).slug


def default_run_id(mode: str, now: datetime | None = None) -> str:
    """Mode plus UTC timestamp: unique per submission and sortable, so runs never share a directory."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{mode_slug(mode)}-{stamp}"


JOBSET_REPLICATED_JOB = "node"  # the JobSet's one replicated Job: one pod per node


def pod_hostname(run_id: str, index: int, workload: str = "job") -> str:
    """The hostname of node rank `index`: `<job>-<i>`, or `<jobset>-node-0-<i>` in a JobSet."""
    if workload == "jobset":
        return f"{train_job_name(run_id)}-{JOBSET_REPLICATED_JOB}-0-{index}"
    return f"{train_job_name(run_id)}-{index}"


def validate_run_id(run_id: str, node_count: int, workload: str = "job") -> str:
    """Reject run ids that would make an invalid Job, Service or pod hostname (`<job>-<index>`)."""
    if not _DNS_LABEL.fullmatch(run_id):
        raise SynthError(
            f"run id {run_id!r} must be lowercase letters, digits and '-', starting and ending with a letter or digit"
        )
    for what, name in (("pod hostname", pod_hostname(run_id, node_count - 1, workload)),
                       ("store Service", store_name(run_id))):
        if len(name) > _DNS_LABEL_MAX:
            limit = len(run_id) - (len(name) - _DNS_LABEL_MAX)
            raise SynthError(
                f"run id {run_id!r} is too long: {what} {name!r} exceeds 63 characters "
                f"(use at most {limit} characters)"
            )
    return run_id


def store_name(run_id: str) -> str:
    """The run's store pod's Deployment, its Service (a DNS label) and its NetworkPolicy."""
    return f"{train_job_name(run_id)}{STORE_SUFFIX}"


def train_job_name(run_id: str) -> str:
    """Also the headless Service, ConfigMap and NetworkPolicy name of the run."""
    return f"{TRAIN_PREFIX}{run_id}"


def results_pod_name(run_id: str) -> str:
    return f"{RESULTS_PREFIX}{run_id}"[:_DNS_LABEL_MAX].rstrip("-")


def watch_pod_name(run_id: str) -> str:
    return f"{WATCH_PREFIX}{run_id}"[:_DNS_LABEL_MAX].rstrip("-")


def export_job_name(run_id: str, fmt: str) -> str:
    """One export Job per run and format: exporting another format never replaces a running one."""
    return f"{EXPORT_PREFIX}{fmt}-{run_id}"[:_DNS_LABEL_MAX].rstrip("-")


def base_labels(component: str) -> dict[str, str]:
    return {LABEL_PART_OF: PART_OF, LABEL_COMPONENT: component}


def run_labels(run_id: str, mode: str) -> dict[str, str]:
    """Labels of every object of one training run (the Service and NetworkPolicy select on these)."""
    return {**base_labels(COMPONENT_TRAIN), LABEL_RUN_ID: run_id, LABEL_MODE: mode_slug(mode)}


def run_selector(run_id: str) -> dict[str, str]:
    """The smallest label set that picks exactly one run's training pods."""
    return {LABEL_COMPONENT: COMPONENT_TRAIN, LABEL_RUN_ID: run_id}


def store_labels(run_id: str, mode: str) -> dict[str, str]:
    """The store pod's: the run's labels under another component, so that the training
    Service, NetworkPolicy and anti-affinity never select it."""
    return {**run_labels(run_id, mode), LABEL_COMPONENT: COMPONENT_STORE}


def store_selector(run_id: str) -> dict[str, str]:
    return {LABEL_COMPONENT: COMPONENT_STORE, LABEL_RUN_ID: run_id}
