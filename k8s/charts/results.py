"""Short-lived, read-only pods through which the wrapper reads a run off FSx: `results` copies
its files, `watch` runs the live view (`python -m trainer.telemetry.status`) in it.

Each only sleeps: `kubectl cp` and `kubectl exec` reach the files through it, then the wrapper
deletes it and its NetworkPolicy (which isolates it both ways). The deadline removes the pod
even if the wrapper dies, so it cannot keep FSx mounted: a copy's half hour, a watch's half day.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cdk8s import Chart
from cdk8s_plus_35 import k8s
from constructs import Construct

from k8s import checkov, image, naming, network_policy, pod
from k8s.charts.base import meta
from k8s.deployment import Deployment

CONTAINER = "results"
PROBE_SKIPS = (
    ("CKV_K8S_8", "No liveness probe: the container only sleeps, nothing in it can hang, and "
                  "activeDeadlineSeconds ends the pod whatever happens"),
    ("CKV_K8S_9", "No readiness probe: the pod serves no traffic, and the wrapper waits for Ready "
                  "only to know that the container runs, which is what Ready means without a probe"),
)


@dataclass(frozen=True)
class Reader:
    """What one reading pod is for: its component label, its name, how long it may live."""

    component: str
    pod_name: Callable[[str], str]
    lifetime_s: int


RESULTS = Reader(naming.COMPONENT_RESULTS, naming.results_pod_name, 1800)
WATCH = Reader(naming.COMPONENT_WATCH, naming.watch_pod_name, 12 * 3600)


class ResultsChart(Chart):
    reader = RESULTS

    def __init__(self, scope: Construct, id: str, dep: Deployment) -> None:
        super().__init__(scope, id)
        reader = self.reader
        labels = {**naming.base_labels(reader.component), naming.LABEL_RUN_ID: dep.run_id}
        container = k8s.Container(
            name=CONTAINER,
            image=dep.image.reference,
            image_pull_policy=dep.image.pull_policy,
            command=["sleep", str(reader.lifetime_s)],
            resources=pod.bounded_resources(),
            security_context=pod.container_security(pod.APP_UID),
            volume_mounts=[pod.mount(pod.FSX_VOLUME, dep.fsx_mount, read_only=True)],
        )
        spec = pod.pod_spec(
            restart_policy="Never",
            active_deadline_seconds=reader.lifetime_s,
            termination_grace_period_seconds=0,
            node_selector=pod.gpu_node_selector(dep.instance),
            tolerations=pod.gpu_tolerations(),
            containers=[container],
            volumes=[pod.fsx_volume(dep.fsx_claim, read_only=True)],
        )
        name = reader.pod_name(dep.run_id)
        k8s.KubeNetworkPolicy(
            self, "network-policy", metadata=meta(name, labels, dep.namespace), spec=network_policy.isolated(labels)
        )
        skips = checkov.annotations([*PROBE_SKIPS, *image.checkov_skips(dep.image)])
        k8s.KubePod(self, "pod", metadata=meta(name, labels, dep.namespace, skips), spec=spec)


class WatchChart(ResultsChart):
    """The pod `nvrx-eks watch` runs the live view in."""

    reader = WATCH
