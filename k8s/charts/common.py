"""Objects shared by every run of a namespace: the service account the pods run as, and the
DaemonSet that keeps the trainer image on every GPU node.

The pre-pull DaemonSet runs one idle container of the trainer image on each GPU node of the
profile's instance type. A node that joins (a replacement instance, a spare's) pulls the image
as soon as it is Ready, before its device plugins advertise GPUs and EFA cards and a training
pod can be scheduled there, and the running container keeps the kubelet's image garbage
collector from ever removing it. Each submit applies it with the run's image, so every node,
the spares included, holds the newest image before a pod needs it (all nodes pull at once:
maxUnavailable 100 %). It tolerates the GPU taint only, requests almost nothing, and has no
network: its NetworkPolicy isolates it.
"""

from __future__ import annotations

from cdk8s import Chart
from cdk8s_plus_35 import k8s
from constructs import Construct

from k8s import checkov, image, naming, network_policy, pod
from k8s.charts.base import meta
from k8s.deployment import Deployment

PREPULL_CONTAINER = "image"
PREPULL_SKIPS = (
    ("CKV_K8S_8", "No liveness probe: the container only sleeps to keep the image in use on its "
                  "node; nothing in it can hang, and a restart would not pull anything"),
    ("CKV_K8S_9", "No readiness probe: the pod serves no traffic; Ready only says that the image "
                  "is on the node, which is what Ready means without a probe"),
)


def prepull_daemon_set(scope: Construct, dep: Deployment) -> None:
    labels = naming.base_labels(naming.COMPONENT_PREPULL)
    container = k8s.Container(
        name=PREPULL_CONTAINER,
        image=dep.image.reference,
        image_pull_policy=dep.image.pull_policy,
        command=["sleep", "infinity"],
        resources=pod.bounded_resources(cpu="10m", memory="16Mi", cpu_limit="100m"),
        security_context=pod.container_security(pod.APP_UID),
    )
    spec = pod.pod_spec(
        termination_grace_period_seconds=0,  # sleep ignores SIGTERM; nothing to save
        node_selector=pod.gpu_node_selector(dep.instance),
        tolerations=[pod.gpu_taint_toleration()],  # DaemonSet pods tolerate node loss already
        containers=[container],
    )
    name = naming.PREPULL_DAEMONSET
    k8s.KubeNetworkPolicy(scope, "prepull-network-policy", metadata=meta(name, labels, dep.namespace),
                          spec=network_policy.isolated(labels))
    skips = checkov.annotations([*PREPULL_SKIPS, *image.checkov_skips(dep.image)])
    k8s.KubeDaemonSet(
        scope,
        "prepull",
        metadata=meta(name, labels, dep.namespace, skips),
        spec=k8s.DaemonSetSpec(
            selector=k8s.LabelSelector(match_labels=labels),
            update_strategy=k8s.DaemonSetUpdateStrategy(
                type="RollingUpdate",
                rolling_update=k8s.RollingUpdateDaemonSet(max_unavailable=k8s.IntOrString.from_string("100%")),
            ),
            template=k8s.PodTemplateSpec(metadata=k8s.ObjectMeta(labels=labels), spec=spec),
        ),
    )


class CommonChart(Chart):
    def __init__(self, scope: Construct, id: str, dep: Deployment) -> None:
        super().__init__(scope, id)
        # The pods never call the Kubernetes API: no token is mounted.
        k8s.KubeServiceAccount(
            self,
            "service-account",
            metadata=meta(naming.SERVICE_ACCOUNT, naming.base_labels("identity"), dep.namespace),
            automount_service_account_token=False,
        )
        prepull_daemon_set(self, dep)
