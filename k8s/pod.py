"""Pod building blocks shared by the training, data-prep, results and export charts.

Security model (why root only where EFA is used): EFA registers host memory with the NIC, which
the kernel counts against RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK. Kubernetes has
no ambient capabilities, so an added capability is effective only for uid 0; a non-root
process would depend on the node's containerd memlock limit instead. Training pods on EFA
instances therefore run as uid 0 with every capability dropped except IPC_LOCK, no privilege
escalation and the RuntimeDefault seccomp profile; every other container runs as the image's
non-root user. FSx for Lustre ignores fsGroup, so a short root init container (CHOWN and
DAC_OVERRIDE only) creates the directories a non-root container writes and hands them over.
Every container's root filesystem is read-only; what it writes goes to its volumes.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from cdk8s_plus_35 import k8s

from config import InstanceSpec, contract
from k8s import naming
from k8s.errors import SynthError
from k8s.image import TrainerImage

APP_UID = 10001  # the non-root user the Dockerfile creates (tests check they agree)
ROOT_UID = 0
FSX_VOLUME = "fsx"
SHM_VOLUME = "dshm"
CONFIG_VOLUME = "settings"
NODE_LOCAL_VOLUME = "node-local"
SCRATCH_VOLUME = "scratch"
HF_TOKEN_VOLUME = "hf-token"
INIT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE")


def container_security(uid: int, add: Sequence[str] = ()) -> k8s.SecurityContext:
    """Not privileged, no escalation, all capabilities dropped except `add`, and a read-only root
    filesystem: a container writes only to its volumes (the scratch volume for temporary files
    and caches). runc makes the root read-only after the NVIDIA runtime hooks have put the driver
    into it, so GPU containers start as usual."""
    return k8s.SecurityContext(
        privileged=False,
        allow_privilege_escalation=False,
        read_only_root_filesystem=True,
        run_as_user=uid,
        run_as_group=uid,
        run_as_non_root=uid != ROOT_UID,
        capabilities=k8s.Capabilities(drop=["ALL"], add=list(add) or None),
        seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault"),
    )


def security_skips(efa_root: bool) -> list[tuple[str, str]]:
    """The checkov findings this security model accepts, with its reasons: the init container's
    two capabilities, and uid 0 with IPC_LOCK in a trainer that uses EFA."""
    init = ("CHOWN and DAC_OVERRIDE only in the init container, which creates the run's directories "
            "on FSx (FSx ignores fsGroup) and hands them to the pod's user")
    if not efa_root:
        return [("CKV_K8S_25", f"{init}.")]
    root = ("uid 0 only so that the added IPC_LOCK is effective (Kubernetes has no ambient "
            "capabilities): EFA registers memory with the NIC beyond RLIMIT_MEMLOCK. Every other "
            "capability is dropped, with no privilege escalation and the RuntimeDefault seccomp profile")
    return [
        ("CKV_K8S_23", f"The trainer runs as {root}."),
        ("CKV_K8S_40", f"The trainer runs as {root}; it holds none of host root's other powers."),
        ("CKV_K8S_25", f"IPC_LOCK only in the trainer, for EFA memory registration; {init}."),
    ]


def pod_spec(**fields) -> k8s.PodSpec:
    """A pod of the run, hardened alike everywhere: the run's service account with no API token
    mounted (no pod talks to the API server), no service-link variables, the RuntimeDefault
    seccomp profile; `fields` add what the pod itself needs."""
    return k8s.PodSpec(service_account_name=naming.SERVICE_ACCOUNT,
                       automount_service_account_token=False, enable_service_links=False,
                       security_context=k8s.PodSecurityContext(
                           seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault")),
                       **fields)


def fsx_volume(claim: str, read_only: bool = False) -> k8s.Volume:
    """The stack's static FSx claim; the manifests never create the PV or PVC themselves."""
    source = k8s.PersistentVolumeClaimVolumeSource(claim_name=claim, read_only=read_only or None)
    return k8s.Volume(name=FSX_VOLUME, persistent_volume_claim=source)


def shm_volume(size: str) -> k8s.Volume:
    """A memory-backed /dev/shm bounded by the profile, instead of the host's shared /dev/shm."""
    source = k8s.EmptyDirVolumeSource(medium="Memory", size_limit=k8s.Quantity.from_string(size))
    return k8s.Volume(name=SHM_VOLUME, empty_dir=source)


def scratch_volume() -> k8s.Volume:
    """A node-disk emptyDir for what would otherwise go to the root filesystem: temporary files
    (the launchers' logs and sockets) and the home directory's caches (Hugging Face downloads,
    compiler caches). Unbounded, like the writable root layer it stands in for."""
    return k8s.Volume(name=SCRATCH_VOLUME, empty_dir=k8s.EmptyDirVolumeSource())


def hf_token_volume() -> k8s.Volume:
    """The user's Hugging Face token Secret as a file. Optional: without the Secret the directory
    is empty and downloads are anonymous, which public models and C4 allow."""
    items = [k8s.KeyToPath(key=naming.HF_TOKEN_KEY, path=naming.HF_TOKEN_KEY)]
    source = k8s.SecretVolumeSource(secret_name=naming.HF_TOKEN_SECRET, items=items, optional=True)
    return k8s.Volume(name=HF_TOKEN_VOLUME, secret=source)


def config_volume(config_map: str) -> k8s.Volume:
    return k8s.Volume(name=CONFIG_VOLUME, config_map=k8s.ConfigMapVolumeSource(name=config_map))


def node_local_volume(host_path: str) -> k8s.Volume:
    """The run's directory on the instance-store RAID; created by the kubelet on first use."""
    source = k8s.HostPathVolumeSource(path=host_path, type="DirectoryOrCreate")
    return k8s.Volume(name=NODE_LOCAL_VOLUME, host_path=source)


def mount(volume: str, path: str, read_only: bool = False, sub_path: str | None = None) -> k8s.VolumeMount:
    return k8s.VolumeMount(name=volume, mount_path=path, read_only=read_only or None, sub_path=sub_path)


def gpu_node_selector(spec: InstanceSpec) -> dict[str, str]:
    """Pin pods to the stack's GPU node group of exactly the profile's instance type."""
    return {
        naming.NODE_GROUP_LABEL: naming.NODE_GROUP_GPU,
        naming.INSTANCE_TYPE_LABEL: spec.instance_type,
    }


def system_node_selector() -> dict[str, str]:
    """The stack's system node group: CPU work that must not take a GPU node's place."""
    return {naming.NODE_GROUP_LABEL: naming.NODE_GROUP_SYSTEM}


def gpu_taint_toleration() -> k8s.Toleration:
    """The GPU nodes' taint: only pods that tolerate it run there."""
    return k8s.Toleration(
        key=naming.GPU_TAINT_KEY,
        operator="Equal",
        value=naming.GPU_TAINT_VALUE,
        effect=naming.GPU_TAINT_EFFECT,
    )


def gpu_tolerations() -> list[k8s.Toleration]:
    """The GPU taint, and a short stay on a lost node: Kubernetes' default keeps a pod bound to
    an unreachable node for 300 s; evicted, a lost pod is replaced (at once in the ft_launcher
    modes, which take in a spare meanwhile), and a torchrun gang can restart."""
    return [
        gpu_taint_toleration(),
        *(
            k8s.Toleration(
                key=key,
                operator="Exists",
                effect="NoExecute",
                toleration_seconds=contract.NODE_LOSS_TOLERATION_S,
            )
            for key in (naming.NOT_READY_TAINT, naming.UNREACHABLE_TAINT)
        ),
    ]


def one_pod_per_node(selector: Mapping[str, str]) -> k8s.Affinity:
    """Required anti-affinity on hostname: two ranks never share a node's GPUs and EFAs."""
    term = k8s.PodAffinityTerm(
        label_selector=k8s.LabelSelector(match_labels=dict(selector)),
        topology_key=naming.HOSTNAME_LABEL,
    )
    return k8s.Affinity(
        pod_anti_affinity=k8s.PodAntiAffinity(required_during_scheduling_ignored_during_execution=[term])
    )


def prepare_dirs_script(dirs: Sequence[str], owner_uid: int, copies: Sequence[tuple[str, str]] = ()) -> str:
    """Shell for the init container: create dirs, copy files in, hand both to `owner_uid`."""
    if not dirs:
        raise SynthError("prepare_dirs_script needs at least one directory")
    owned = [*dirs, *(dst for _, dst in copies)]
    lines = ["set -eu", "mkdir -p " + " ".join(shlex.quote(d) for d in dirs)]
    lines += [f"cp {shlex.quote(src)} {shlex.quote(dst)}" for src, dst in copies]
    lines.append(f"chown {owner_uid}:{owner_uid} " + " ".join(shlex.quote(p) for p in owned))
    return "\n".join(lines)


def prepare_dirs_container(
    image: TrainerImage,
    dirs: Sequence[str],
    owner_uid: int,
    mounts: Sequence[k8s.VolumeMount],
    copies: Sequence[tuple[str, str]] = (),
) -> k8s.Container:
    return k8s.Container(
        name="prepare-dirs",
        image=image.reference,
        image_pull_policy=image.pull_policy,
        command=["sh", "-c", prepare_dirs_script(dirs, owner_uid, copies)],
        security_context=container_security(ROOT_UID, INIT_CAPABILITIES),
        resources=bounded_resources(),
        volume_mounts=list(mounts),
    )


def bounded_resources(cpu: str = "100m", memory: str = "256Mi", cpu_limit: str = "1") -> k8s.ResourceRequirements:
    """Resources of an init, data-prep or results container, which shares a GPU node with a
    training pod: a memory limit equal to the request (no surprise OOM of the node) and a CPU
    limit, so that a burst of it never takes the trainer's cores. The training container itself
    has no CPU limit (k8s.resources)."""
    return k8s.ResourceRequirements(
        requests={"cpu": k8s.Quantity.from_string(cpu), "memory": k8s.Quantity.from_string(memory)},
        limits={"cpu": k8s.Quantity.from_string(cpu_limit), "memory": k8s.Quantity.from_string(memory)},
    )
