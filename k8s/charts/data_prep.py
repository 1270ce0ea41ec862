"""The one-off Job that tokenizes the profile's data source (C4 by default) onto FSx before the
first run.

It runs on a GPU node (tolerating the taint, requesting no GPU) because the trainer image is
large and already cached there; the system nodes would pull gigabytes for one short job. Its
NetworkPolicy lets it reach DNS and the Hugging Face hub (HTTPS) and nothing else. Bad input (a
source that is not one, a missing text field) exits 2 and fails the Job at once: retrying
cannot fix it.
"""

from __future__ import annotations

import posixpath

from cdk8s import Chart
from cdk8s_plus_35 import k8s
from constructs import Construct

from k8s import checkov, commands, image, naming, network_policy, pod, restart_policy
from k8s.charts.base import meta
from k8s.deployment import HF_TOKEN_MOUNT, SCRATCH_MOUNT, Deployment
from k8s.environment import hub_job_env

CONTAINER = "data-prep"
BACKOFF_LIMIT = 3  # network hiccups while streaming from the hub; more would hide a real error
TOKENIZING_PROCESSES = 2  # one per CPU of the pod
CPU = str(TOKENIZING_PROCESSES)
MEMORY = "8Gi"  # the reading process and each tokenizing one hold a tokenizer and a few batches


class DataPrepChart(Chart):
    def __init__(self, scope: Construct, id: str, dep: Deployment) -> None:
        super().__init__(scope, id)
        labels = naming.base_labels(naming.COMPONENT_DATA_PREP)
        command, args = commands.data_prep_command(dep, TOKENIZING_PROCESSES)
        fsx_mount = pod.mount(pod.FSX_VOLUME, dep.fsx_mount)
        prepare = pod.prepare_dirs_container(
            dep.image,
            [posixpath.dirname(dep.data_dir), dep.data_dir],
            pod.APP_UID,
            [fsx_mount],
        )
        container = k8s.Container(
            name=CONTAINER,
            image=dep.image.reference,
            image_pull_policy=dep.image.pull_policy,
            command=command,
            args=args,
            env=hub_job_env(),
            resources=pod.bounded_resources(cpu=CPU, memory=MEMORY, cpu_limit=CPU),
            security_context=pod.container_security(pod.APP_UID),
            volume_mounts=[
                fsx_mount,
                pod.mount(pod.SCRATCH_VOLUME, SCRATCH_MOUNT),
                pod.mount(pod.HF_TOKEN_VOLUME, HF_TOKEN_MOUNT, read_only=True),
            ],
        )
        pod_spec = pod.pod_spec(
            restart_policy="Never",
            node_selector=pod.gpu_node_selector(dep.instance),
            tolerations=pod.gpu_tolerations(),
            init_containers=[prepare],
            containers=[container],
            volumes=[pod.fsx_volume(dep.fsx_claim), pod.scratch_volume(), pod.hf_token_volume()],
        )
        k8s.KubeNetworkPolicy(
            self,
            "network-policy",
            metadata=meta(naming.DATA_PREP_JOB, labels, dep.namespace),
            spec=network_policy.dns_and_https_out(labels),
        )
        skips = checkov.annotations([*pod.security_skips(efa_root=False), *image.checkov_skips(dep.image)])
        k8s.KubeJob(
            self,
            "job",
            metadata=meta(naming.DATA_PREP_JOB, labels, dep.namespace, skips),
            spec=k8s.JobSpec(
                backoff_limit=BACKOFF_LIMIT,
                # exit 2 (bad input, named in the log) fails the Job without the retries
                # BACKOFF_LIMIT grants network errors; a disruption replaces the pod
                pod_failure_policy=restart_policy.pod_failure_policy(CONTAINER),
                completions=1,
                parallelism=1,
                template=k8s.PodTemplateSpec(metadata=k8s.ObjectMeta(labels=labels), spec=pod_spec),
            ),
        )
