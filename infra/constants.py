"""Numbers and pins the stacks share that are not hardware facts (those live in config.instances).

Each value says why it is what it is; change it here, not in a construct.
"""

from __future__ import annotations

from dataclasses import dataclass

from config import contract

# --- Kubernetes contract with the manifests (k8s/) ------------------------------------------
GPU_NODE_GROUP_LABEL = (contract.NODE_GROUP_LABEL_KEY, contract.NODE_GROUP_GPU)
SYSTEM_NODE_GROUP_LABEL = (contract.NODE_GROUP_LABEL_KEY, contract.NODE_GROUP_SYSTEM)
GPU_TAINT = (contract.GPU_TAINT_KEY, contract.GPU_TAINT_VALUE, contract.GPU_TAINT_EFFECT)
FSX_PVC_NAME = contract.FSX_PVC_NAME

# nodeadm's `instance.localStorage.strategy: RAID0` builds one md RAID0 over every NVMe
# instance-store device, formats it XFS and mounts it at /mnt/k8s-disks/0 (its default mount
# path), then bind-mounts /var/lib/kubelet, /var/lib/containerd and /var/log/pods onto it.
# The node-local checkpoint tier is a directory on that array; pods mount it as a hostPath with
# type DirectoryOrCreate. Source: awslabs/amazon-eks-ami nodeadm API (LocalStorageOptions) and
# templates/shared/runtime/bin/setup-local-disks.
NODEADM_RAID_MOUNT = "/mnt/k8s-disks/0"
NODE_LOCAL_DIR = f"{NODEADM_RAID_MOUNT}/nvrx"

# --- Huge pages on EFA nodes ------------------------------------------------------------------
# The per-pod amount and the headroom are part of the contract (config/contract.py). kubelet only
# advertises huge pages that exist when it starts, so they are allocated in user data, which
# cloud-init runs before nodeadm-run.service starts kubelet.
NR_HUGEPAGES_2MI = contract.NR_HUGEPAGES_2MI

# --- Huge pages behind tmpfs on GPU nodes -------------------------------------------------------
# `shmem_enabled = force` gives every tmpfs mount huge pages, the pods' /dev/shm emptyDirs
# included: those take no mount options, so `huge=` cannot be set on them. systemd-tmpfiles
# writes it again at every boot. Source: the kernel's admin-guide/mm/transhuge.
SHMEM_THP_KNOB = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
SHMEM_THP_TMPFILES = "/etc/tmpfiles.d/90-nvrx-shmem-thp.conf"

# --- Node disks -------------------------------------------------------------------------------
# The root volume holds the OS and logs; images and kubelet state move to the NVMe RAID0.
# Without instance store, images stay on the root volume, so it must hold them (CUDA images
# are 15-25 GB compressed, often twice that unpacked, and two versions coexist during updates).
ROOT_VOLUME_GIB_WITH_NVME = 200
ROOT_VOLUME_GIB_WITHOUT_NVME = 500
SYSTEM_ROOT_VOLUME_GIB = 50

# Image pulls a GPU node's kubelet runs at once (serializeImagePulls off): the trainer image
# beside the device plugins', the VPC CNI's and the monitoring agents'.
MAX_PARALLEL_IMAGE_PULLS = 5

# Kubernetes service CIDR, set explicitly so nodeadm's NodeConfig can name it at synth time.
SERVICE_IPV4_CIDR = "172.20.0.0/16"

# --- Pinned Helm charts (checked 2026-08) -----------------------------------------------------
@dataclass(frozen=True)
class PinnedChart:
    """A Helm chart at one version, and the release and namespace it is installed as
    (`infra.constructs.helm.install`). Bump a version here."""

    repository: str
    chart: str
    version: str
    release: str
    namespace: str


# NVIDIA device plugin: https://github.com/NVIDIA/k8s-device-plugin (tag v0.20.0,
# deployments/helm/nvidia-device-plugin/Chart.yaml).
NVIDIA_DEVICE_PLUGIN = PinnedChart("https://nvidia.github.io/k8s-device-plugin", "nvidia-device-plugin",
                                   "0.20.0", release="nvidia-device-plugin", namespace="kube-system")
# EFA device plugin: https://github.com/aws/eks-charts stable/aws-efa-k8s-device-plugin
# (Chart.yaml version v0.5.30, image v0.5.20).
EFA_DEVICE_PLUGIN = PinnedChart("https://aws.github.io/eks-charts", "aws-efa-k8s-device-plugin",
                                "v0.5.30", release="aws-efa-k8s-device-plugin", namespace="kube-system")

# --- EKS add-ons --------------------------------------------------------------------------------
# Versions are left to EKS: CreateAddon without a version installs the default version for the
# cluster's Kubernetes version, which is the combination AWS tests.
FSX_CSI_ADDON = "aws-fsx-csi-driver"
FSX_CSI_CONTROLLER_SA = "fsx-csi-controller-sa"
FSX_CSI_DRIVER = "fsx.csi.aws.com"
VPC_CNI_SERVICE_ACCOUNT = ("kube-system", "aws-node")
# The Amazon CloudWatch Observability add-on (profile `observability.cloudwatch`): its CloudWatch
# agent and Fluent Bit run as this service account of its namespace; EKS Pod Identity serves it
# from add-on version 3.1.0 on.
CLOUDWATCH_ADDON = "amazon-cloudwatch-observability"
CLOUDWATCH_AGENT_SA = "cloudwatch-agent"

# Lustre LNet ports: 988 plus 1018-1023 (FSx for Lustre user guide, "File system access control
# with Amazon VPC").
LUSTRE_PORT = 988
LUSTRE_PORT_RANGE = (1018, 1023)



# --- JobSet (workload: jobset) -------------------------------------------------------------------
# kubernetes-sigs/jobset publishes its chart as an OCI artifact on registry.k8s.io
# (charts/jobset in the repository).
JOBSET = PinnedChart("oci://registry.k8s.io/jobset/charts/jobset", "jobset", "0.10.1",
                     release="jobset", namespace="jobset-system")

# --- GPU node health (infra.constructs.node_health) --------------------------------------------------
# The EKS node monitoring agent add-on: on every node, it sets the conditions the node-health
# agent acts on (GPU Xid errors, EFA and network faults, kernel and container runtime problems).
NODE_MONITORING_ADDON = "eks-node-monitoring-agent"
NODE_HEALTH_NAMESPACE = "kube-system"
# A plain Python image from ECR Public (the program is standard library only). Pinned to a
# release line: bump it here.
NODE_HEALTH_IMAGE = "public.ecr.aws/docker/library/python:3.12-slim"
# infra.node_health.agent.Rules: a NotReady node is replaced after 60 s (Kubernetes marks it
# NotReady after 40-50 s of silence), a hardware condition after 30 s, a booting node is left
# alone for 15 minutes, one node at a time.
NODE_HEALTH_RULES = {"NOT_READY_GRACE_S": 60, "HARDWARE_GRACE_S": 30, "BOOT_GRACE_S": 900,
                     "MAX_AT_ONCE": 1, "POLL_S": 10}
