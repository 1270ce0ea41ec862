"""A short-lived, read-only pod through which the wrapper copies a run's results off FSx.

It only sleeps: `kubectl cp` reads the files through it, then the wrapper deletes it and its
NetworkPolicy (which isolates it both ways). The deadline removes the pod even if the wrapper
dies mid-copy, so it cannot keep FSx mounted.
"""

from __future__ import annotations

from cdk8s import Chart
from cdk8s_plus_35 import k8s
from constructs import Construct

from k8s import checkov, image, naming, network_policy, pod
from k8s.charts.base import meta
from k8s.deployment import Deployment

LIFETIME_S = 1800
CONTAINER = "results"
PROBE_SKIPS = (
    ("CKV_K8S_8", "No liveness probe: the container only sleeps, nothing in it can hang, and "
                  "activeDeadlineSeconds ends the pod whatever happens"),
    ("CKV_K8S_9", "No readiness probe: the pod serves no traffic, and the wrapper waits for Ready "
                  "only to know that the container runs, which is what Ready means without a probe"),
)


class ResultsChart(Chart):
    def __init__(self, scope: Construct, id: str, dep: Deployment) -> None:
        super().__init__(scope, id)
        labels = {**naming.base_labels(naming.COMPONENT_RESULTS), naming.LABEL_RUN_ID: dep.run_id}
        container = k8s.Container(
            name=CONTAINER,
            image=dep.image.reference,
            image_pull_policy=dep.image.pull_policy,
            command=["sleep", str(LIFETIME_S)],
            resources=pod.bounded_resources(),
            security_context=pod.container_security(pod.APP_UID),
            volume_mounts=[pod.mount(pod.FSX_VOLUME, dep.fsx_mount, read_only=True)],
        )
        spec = k8s.PodSpec(
            service_account_name=naming.SERVICE_ACCOUNT,
            automount_service_account_token=False,
            enable_service_links=False,
            restart_policy="Never",
            active_deadline_seconds=LIFETIME_S,
            termination_grace_period_seconds=0,
            security_context=pod.pod_security(),
            node_selector=pod.gpu_node_selector(dep.instance),
            tolerations=pod.gpu_tolerations(),
            containers=[container],
            volumes=[pod.fsx_volume(dep.fsx_claim, read_only=True)],
        )
        name = naming.results_pod_name(dep.run_id)
        k8s.KubeNetworkPolicy(
            self, "network-policy", metadata=meta(name, labels, dep.namespace), spec=network_policy.isolated(labels)
        )
        skips = checkov.annotations([*PROBE_SKIPS, *image.checkov_skips(dep.image)])
        k8s.KubePod(self, "pod", metadata=meta(name, labels, dep.namespace, skips), spec=spec)
