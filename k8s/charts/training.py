"""One training run: its settings ConfigMap, headless Service, NetworkPolicy and Indexed Job
(or, with `workload: jobset`, a JobSet around that Job, which creates the Service itself), in
the ft_launcher modes the run's store pod before them (`k8s.charts.store`), and
with `observability.pod_monitor` a PodMonitor for the Prometheus operator. Every pod serves
/metrics and says so in the conventional `prometheus.io/*` annotations.

Every object is named `train-<run-id>` (the store's `train-<run-id>-store`), so runs coexist
and the wrapper can address one run. The Job runs node_count + spare_nodes pods, one per node.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from cdk8s import ApiObject, ApiObjectMetadata, Chart, JsonPatch
from cdk8s_plus_35 import k8s
from constructs import Construct

from config.contract import METRICS_PATH

from k8s import checkov, commands, image, naming, network_policy, pod, restart_policy
from k8s.charts.base import meta
from k8s.charts.store import add_store
from k8s.deployment import (
    CONFIG_MOUNT,
    HF_TOKEN_MOUNT,
    NODE_LOCAL_MOUNT,
    SCRATCH_MOUNT,
    SETTINGS_FILE,
    SHM_MOUNT,
    Deployment,
)
from k8s.environment import training_env
from k8s.resources import CPU_LIMIT_SKIP, check_memory_budget, gib_quantity, shm_size_gib, training_resources

PORTS = naming.STORE_PORTS
POD_MONITOR_API_VERSION = "monitoring.coreos.com/v1"
SCRAPE_INTERVAL = "30s"
# Pod labels a PodMonitor copies onto every series: which run, and which node of it.
POD_TARGET_LABELS = (naming.LABEL_RUN_ID, naming.COMPLETION_INDEX_KEY)


def scrape_annotations() -> dict[str, str]:
    """The conventional annotations a Prometheus `kubernetes_sd` configuration keeps pods by."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(naming.METRICS_PORT),
            "prometheus.io/path": METRICS_PATH}


def trainer_uid(dep: Deployment) -> int:
    """Root (IPC_LOCK only) where EFA needs locked memory, the image's user elsewhere (see k8s.pod)."""
    return pod.ROOT_UID if dep.has_efa else pod.APP_UID


def settings_document(dep: Deployment) -> str:
    """The run's full settings, mounted into the pod and copied into the run directory."""
    doc = {
        "run_id": dep.run_id,
        "mode": dep.mode,
        "job": dep.job_name,
        "master_addr": dep.master_addr,
        "external_store": dep.external_store,
        "run_dir": dep.run_dir,
        "image": dep.image.reference,
        "instance": asdict(dep.instance),
        "profile": dep.profile.model_dump(mode="json"),
        "launcher_args": commands.launcher_argv(dep),
        "trainer_args": commands.trainer_argv(dep),
    }
    return json.dumps(doc, indent=2, sort_keys=True)


class TrainingChart(Chart):
    def __init__(self, scope: Construct, id: str, dep: Deployment) -> None:
        super().__init__(scope, id)
        self.dep = dep
        self.run_labels = naming.run_labels(dep.run_id, dep.mode)
        self.selector = naming.run_selector(dep.run_id)
        self._config_map()
        if dep.external_store:
            add_store(self, dep)  # first in the file: the store is up before the launchers
        self._network_policy()
        if dep.workload == "jobset":
            self._jobset()
        else:
            self._service()
            self._job()
        if dep.profile.observability.pod_monitor:
            self._pod_monitor()

    def _meta(self) -> k8s.ObjectMeta:
        return meta(self.dep.job_name, self.run_labels, self.dep.namespace)

    def _scan_skips(self) -> dict[str, str] | None:
        """The workload object's checkov skips, each with the reason kept beside its cause."""
        dep = self.dep
        return checkov.annotations(
            [*pod.security_skips(efa_root=dep.has_efa), CPU_LIMIT_SKIP, *image.checkov_skips(dep.image)]
        )

    def _config_map(self) -> None:
        k8s.KubeConfigMap(self, "settings", metadata=self._meta(), data={SETTINGS_FILE: settings_document(self.dep)})

    def _service(self) -> None:
        """Headless, and publishing not-ready pods: DNS for `<job>-<i>.<job>` exists as soon as a
        pod has an IP, before any readiness, so peers can rendezvous immediately."""
        ports = [
            k8s.ServicePort(name=name, port=port, target_port=k8s.IntOrString.from_number(port)) for name, port in PORTS
        ]
        spec = k8s.ServiceSpec(cluster_ip="None", publish_not_ready_addresses=True, selector=self.selector, ports=ports)
        k8s.KubeService(self, "service", metadata=self._meta(), spec=spec)

    def _network_policy(self) -> None:
        spec = network_policy.training(
            self.selector, self.dep.profile.observability.monitoring_namespace, naming.METRICS_PORT
        )
        k8s.KubeNetworkPolicy(self, "network-policy", metadata=self._meta(), spec=spec)

    def _pod_monitor(self) -> None:
        """The Prometheus operator's scrape configuration of this run's pods."""
        spec = {
            "selector": {"matchLabels": dict(self.selector)},
            "podMetricsEndpoints": [
                {"port": naming.METRICS_PORT_NAME, "path": METRICS_PATH, "interval": SCRAPE_INTERVAL}
            ],
            "podTargetLabels": list(POD_TARGET_LABELS),
        }
        monitor = ApiObject(
            self,
            "pod-monitor",
            api_version=POD_MONITOR_API_VERSION,
            kind="PodMonitor",
            metadata=ApiObjectMetadata(name=self.dep.job_name, namespace=self.dep.namespace, labels=self.run_labels),
        )
        monitor.add_json_patch(JsonPatch.add("/spec", spec))

    def _job_spec(self, backoff_limit: int) -> k8s.JobSpec:
        """One pod per node of the group: completion index i is node rank i, spares included
        (the launchers decide which of them train)."""
        pods = self.dep.pod_count
        return k8s.JobSpec(
            completion_mode="Indexed",
            completions=pods,
            parallelism=pods,
            backoff_limit=backoff_limit,
            pod_failure_policy=restart_policy.training_pod_failure_policy(self.dep),
            pod_replacement_policy=restart_policy.pod_replacement_policy(self.dep),
            template=k8s.PodTemplateSpec(
                metadata=k8s.ObjectMeta(labels=self.run_labels, annotations=scrape_annotations()),
                spec=self._pod_spec(),
            ),
        )

    def _job(self) -> None:
        metadata = meta(self.dep.job_name, self.run_labels, self.dep.namespace, self._scan_skips())
        k8s.KubeJob(self, "job", metadata=metadata, spec=self._job_spec(restart_policy.backoff_limit(self.dep)))

    def _jobset(self) -> None:
        """A JobSet of one Indexed Job (one pod per node). In the torchrun modes the Job
        tolerates no failure (backoffLimit 0): the first failed pod fails it, and the JobSet's
        failure policy then restarts every pod of the run at once, up to
        recovery.backoff_limit times. In the ft_launcher modes a lost pod is replaced within
        the Job, as in a plain Job (`k8s.restart_policy`)."""
        job = k8s.KubeJob.manifest(metadata=self._meta(),
                                   spec=self._job_spec(restart_policy.jobset_child_backoff_limit(self.dep)))
        jobset = ApiObject(
            self,
            "jobset",
            api_version=restart_policy.JOBSET_API_VERSION,
            kind="JobSet",
            metadata=ApiObjectMetadata(
                name=self.dep.job_name,
                namespace=self.dep.namespace,
                labels=self.run_labels,
                annotations=self._scan_skips(),
            ),
        )
        jobset.add_json_patch(JsonPatch.add("/spec", restart_policy.jobset_spec(self.dep, job["spec"], self.run_labels)))

    def _pod_spec(self) -> k8s.PodSpec:
        dep = self.dep
        return pod.pod_spec(
            subdomain=dep.service_name,
            restart_policy="Never",
            # SIGTERM to SIGKILL: the ranks commit their newest state in it (trainer.termination)
            termination_grace_period_seconds=dep.termination_grace_s,
            node_selector=pod.gpu_node_selector(dep.instance),
            tolerations=pod.gpu_tolerations(),
            affinity=pod.one_pod_per_node(self.selector),
            init_containers=[self._prepare_dirs()],
            containers=[self._trainer()],
            volumes=self._volumes(),
        )

    def _volumes(self) -> list[k8s.Volume]:
        dep = self.dep
        volumes = [
            pod.fsx_volume(dep.fsx_claim),
            pod.shm_volume(gib_quantity(shm_size_gib(dep.profile))),
            pod.config_volume(dep.job_name),
            pod.scratch_volume(),
            pod.hf_token_volume(),
        ]
        if dep.node_local_host_path:
            volumes.append(pod.node_local_volume(dep.node_local_host_path))
        return volumes

    def _data_mounts(self) -> list[k8s.VolumeMount]:
        mounts = [pod.mount(pod.FSX_VOLUME, self.dep.fsx_mount)]
        if self.dep.node_local_host_path:
            mounts.append(pod.mount(pod.NODE_LOCAL_VOLUME, NODE_LOCAL_MOUNT))
        return mounts

    def _prepare_dirs(self) -> k8s.Container:
        dep = self.dep
        dirs = [dep.run_dir, dep.checkpoint_dir]
        if dep.node_local_host_path:
            dirs.append(NODE_LOCAL_MOUNT)
        return pod.prepare_dirs_container(
            dep.image,
            dirs,
            trainer_uid(dep),
            [*self._data_mounts(), pod.mount(pod.CONFIG_VOLUME, CONFIG_MOUNT, read_only=True)],
            copies=[(f"{CONFIG_MOUNT}/{SETTINGS_FILE}", f"{dep.run_dir}/{SETTINGS_FILE}")],
        )

    def _trainer(self) -> k8s.Container:
        dep = self.dep
        resources = training_resources(dep.instance)
        check_memory_budget(dep.profile, resources)
        command, args = commands.training_command(dep)
        return k8s.Container(
            name=naming.TRAINER_CONTAINER,
            image=dep.image.reference,
            image_pull_policy=dep.image.pull_policy,
            command=command,
            args=args,
            env=training_env(dep),
            ports=[
                k8s.ContainerPort(name=name, container_port=port)
                for name, port in (*PORTS, (naming.METRICS_PORT_NAME, naming.METRICS_PORT))
            ],
            resources=resources.requirements(),
            security_context=pod.container_security(trainer_uid(dep), ["IPC_LOCK"] if dep.has_efa else []),
            volume_mounts=[
                *self._data_mounts(),
                pod.mount(pod.SHM_VOLUME, SHM_MOUNT),
                pod.mount(pod.CONFIG_VOLUME, CONFIG_MOUNT, read_only=True),
                pod.mount(pod.SCRATCH_VOLUME, SCRATCH_MOUNT),
                pod.mount(pod.HF_TOKEN_VOLUME, HF_TOKEN_MOUNT, read_only=True),
            ],
        )
