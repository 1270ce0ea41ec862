"""The run's store pod: every store the launchers and ranks share, on no training node.

In the ft_launcher modes no node is special: the rendezvous store, the process-group store
and the in-process Wrapper's stores (the contract's ports from P, `config.contract`) are
served by `python -m trainer.recovery.store_server` in a pod of their own on a system node, and
every launcher is given `--master_addr <this Service> --external_store`. The pod gets the
launchers' rendezvous flags: with NVRx 0.6+ it closes their rounds too. Any training node,
node rank 0's included, can then be lost and its place taken by a spare.

- A Deployment of one replica, `Recreate`: never two stores at once (launchers would split
  between them). A PodDisruptionBudget keeps a node drain from evicting it mid-run; a store
  that dies all the same is started again by the Deployment, and the launchers re-rendezvous.
- A ClusterIP Service with a stable name and address for the launchers, which wait for it to
  answer within `recovery.rdzv_join_timeout_s`: no init container is needed to order the two.
  Ready means the master port accepts connections (what the store server promises).
- Unprivileged, non-root, read-only root filesystem, CPU and memory limited.
- Its NetworkPolicy admits the run's training pods on the store ports and nothing else; it
  sends nothing (replies to accepted connections are not new traffic). The kubelet's probes
  come from the node's address, which the VPC CNI's policy agent always admits.
"""

from __future__ import annotations

from cdk8s_plus_35 import k8s
from constructs import Construct

from k8s import checkov, commands, image, naming, pod
from k8s.charts.base import meta
from k8s.deployment import SCRATCH_MOUNT, Deployment

CONTAINER = "store"
PORTS = naming.STORE_PORTS
# One thread and a socket per connected client; a few hundred bytes of keys per rank. A
# thousand nodes of eight ranks stay well inside these.
CPU_REQUEST = "250m"
CPU_LIMIT = "2"
MEMORY = "1Gi"
STOP_GRACE_S = 10  # the server exits on SIGTERM at once
READY_PERIOD_S = 2
LIVE_PERIOD_S = 10
LIVE_FAILURES = 6  # a minute unanswered: restarting it costs every rank a re-rendezvous


def _probe(period_s: int, failures: int) -> k8s.Probe:
    port = k8s.IntOrString.from_number(naming.RENDEZVOUS_PORT)
    return k8s.Probe(tcp_socket=k8s.TcpSocketAction(port=port), period_seconds=period_s,
                     failure_threshold=failures)


def _container(dep: Deployment) -> k8s.Container:
    command = commands.store_command(dep)
    return k8s.Container(
        name=CONTAINER,
        image=dep.image.reference,
        image_pull_policy=dep.image.pull_policy,
        command=command[:3],
        args=command[3:],
        ports=[k8s.ContainerPort(name=name, container_port=port) for name, port in PORTS],
        resources=pod.bounded_resources(cpu=CPU_REQUEST, memory=MEMORY, cpu_limit=CPU_LIMIT),
        security_context=pod.container_security(pod.APP_UID),
        readiness_probe=_probe(READY_PERIOD_S, 1),
        liveness_probe=_probe(LIVE_PERIOD_S, LIVE_FAILURES),
        volume_mounts=[pod.mount(pod.SCRATCH_VOLUME, SCRATCH_MOUNT)],
    )


def _pod_spec(dep: Deployment) -> k8s.PodSpec:
    return pod.pod_spec(
        termination_grace_period_seconds=STOP_GRACE_S,
        node_selector=pod.system_node_selector(),
        containers=[_container(dep)],
        volumes=[pod.scratch_volume()],
    )


def _network_policy(dep: Deployment) -> k8s.NetworkPolicySpec:
    trainers = k8s.NetworkPolicyPeer(pod_selector=k8s.LabelSelector(match_labels=naming.run_selector(dep.run_id)))
    ports = [k8s.NetworkPolicyPort(protocol="TCP", port=k8s.IntOrString.from_number(p)) for _, p in PORTS]
    return k8s.NetworkPolicySpec(
        pod_selector=k8s.LabelSelector(match_labels=naming.store_selector(dep.run_id)),
        policy_types=["Ingress", "Egress"],
        ingress=[k8s.NetworkPolicyIngressRule(from_=[trainers], ports=ports)],
    )


def add_store(scope: Construct, dep: Deployment) -> None:
    """The store's Deployment, Service, PodDisruptionBudget and NetworkPolicy, into `scope`."""
    labels = naming.store_labels(dep.run_id, dep.mode)
    selector = k8s.LabelSelector(match_labels=naming.store_selector(dep.run_id))
    name = dep.store_name
    k8s.KubeNetworkPolicy(scope, "store-network-policy", metadata=meta(name, labels, dep.namespace),
                          spec=_network_policy(dep))
    service_ports = [k8s.ServicePort(name=n, port=p, target_port=k8s.IntOrString.from_number(p)) for n, p in PORTS]
    k8s.KubeService(scope, "store-service", metadata=meta(name, labels, dep.namespace),
                    spec=k8s.ServiceSpec(type="ClusterIP", selector=naming.store_selector(dep.run_id),
                                         ports=service_ports))
    k8s.KubePodDisruptionBudget(scope, "store-disruption-budget", metadata=meta(name, labels, dep.namespace),
                                spec=k8s.PodDisruptionBudgetSpec(
                                    min_available=k8s.IntOrString.from_number(1), selector=selector))
    skips = checkov.annotations(image.checkov_skips(dep.image))
    k8s.KubeDeployment(
        scope,
        "store",
        metadata=meta(name, labels, dep.namespace, skips),
        spec=k8s.DeploymentSpec(
            replicas=1,
            strategy=k8s.DeploymentStrategy(type="Recreate"),
            selector=selector,
            template=k8s.PodTemplateSpec(metadata=k8s.ObjectMeta(labels=labels), spec=_pod_spec(dep)),
        ),
    )
