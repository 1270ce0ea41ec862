"""The one-off Job that exports a run's checkpoint on FSx (`python -m trainer.export`).

It needs a CPU and memory, no GPU: it runs on the system nodes, unprivileged, as the image's
non-root user. FSx is mounted read-only except for the run's `export/` directory, so an export
can never touch a checkpoint; a short root init container creates that directory and hands it
over (FSx ignores fsGroup). Its memory is sized by what an export holds at once: one file of
weights (`hf`) or one tensor (`dcp`), at least the model's largest parameter.
"""

from __future__ import annotations

import math
import posixpath

from cdk8s import Chart
from cdk8s_plus_35 import k8s
from constructs import Construct

from config.contract import EXPORT_DTYPES, EXPORT_FILE_BYTES
from config.presets import PRESETS, preset_largest_parameter
from k8s import checkov, commands, image, naming, network_policy, pod, restart_policy
from k8s.charts.base import meta
from k8s.deployment import HF_TOKEN_MOUNT, SCRATCH_MOUNT, Deployment
from k8s.environment import hub_job_env

BACKOFF_LIMIT = 2  # a file system hiccup; a damaged checkpoint (exit 2) fails at once
CPU = "1"
GIB = 1 << 30
# Besides the tensors: the interpreter with torch and transformers (0.2 GB), the shards'
# digests (eight 64 MiB chunks hashed at once, before any tensor is held), and room for the
# page cache of the mapped shards, which the kernel reclaims.
OVERHEAD_BYTES = GIB
# A model directory or hub id is sized as the largest preset: its shapes are on FSx, not here.
UNKNOWN_MODEL = "llama3.1-8b"


def held_bytes(dep: Deployment) -> int:
    """The most bytes of tensors the export holds at once."""
    model = dep.train.model if dep.train.model in PRESETS else UNKNOWN_MODEL
    itemsize = 2 if EXPORT_DTYPES[dep.export.dtype] == "bfloat16" else 4
    largest = preset_largest_parameter(model)
    if dep.export.format == "hf":
        return max(EXPORT_FILE_BYTES, largest * itemsize)
    return largest * 4  # dcp: one tensor; Adam's moments stay fp32


def memory(dep: Deployment) -> str:
    return f"{math.ceil((held_bytes(dep) + OVERHEAD_BYTES) / GIB)}Gi"


class ExportChart(Chart):
    def __init__(self, scope: Construct, id: str, dep: Deployment) -> None:
        super().__init__(scope, id)
        labels = {**naming.base_labels(naming.COMPONENT_EXPORT), naming.LABEL_RUN_ID: dep.run_id}
        command, args = commands.export_command(dep)
        prepare = pod.prepare_dirs_container(
            dep.image,
            [dep.export_root],
            pod.APP_UID,
            [pod.mount(pod.FSX_VOLUME, dep.fsx_mount)],
        )
        container = k8s.Container(
            name=naming.EXPORT_CONTAINER,
            image=dep.image.reference,
            image_pull_policy=dep.image.pull_policy,
            command=command,
            args=args,
            env=hub_job_env(),
            resources=pod.bounded_resources(cpu=CPU, memory=memory(dep), cpu_limit=CPU),
            security_context=pod.container_security(pod.APP_UID),
            volume_mounts=[
                pod.mount(pod.FSX_VOLUME, dep.fsx_mount, read_only=True),
                pod.mount(pod.FSX_VOLUME, dep.export_root,
                          sub_path=posixpath.relpath(dep.export_root, dep.fsx_mount)),
                pod.mount(pod.SCRATCH_VOLUME, SCRATCH_MOUNT),
                pod.mount(pod.HF_TOKEN_VOLUME, HF_TOKEN_MOUNT, read_only=True),
            ],
        )
        pod_spec = pod.pod_spec(
            restart_policy="Never",
            node_selector=pod.system_node_selector(),
            init_containers=[prepare],
            containers=[container],
            volumes=[pod.fsx_volume(dep.fsx_claim), pod.scratch_volume(), pod.hf_token_volume()],
        )
        name = naming.export_job_name(dep.run_id, dep.export.format)
        k8s.KubeNetworkPolicy(
            self,
            "network-policy",
            metadata=meta(name, labels, dep.namespace),
            spec=network_policy.dns_and_https_out(labels),  # a hub model's config or tokenizer
        )
        skips = checkov.annotations([*pod.security_skips(efa_root=False), *image.checkov_skips(dep.image)])
        k8s.KubeJob(
            self,
            "job",
            metadata=meta(name, labels, dep.namespace, skips),
            spec=k8s.JobSpec(
                backoff_limit=BACKOFF_LIMIT,
                completions=1,
                parallelism=1,
                pod_failure_policy=restart_policy.pod_failure_policy(naming.EXPORT_CONTAINER),
                pod_replacement_policy="Failed",
                template=k8s.PodTemplateSpec(metadata=k8s.ObjectMeta(labels=labels), spec=pod_spec),
            ),
        )
