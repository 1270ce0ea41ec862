"""What each of our pods may receive and send; one NetworkPolicy selects each pod.

The VPC CNI enforces them (the stack turns on `enableNetworkPolicy`). EFA traffic bypasses the
pod network and is governed by the node security group instead.

- Training pods: ingress from the pods of the same run, on every port (NCCL's bootstrap and
  socket transport listen on ephemeral ports besides the rendezvous ports), and from the pods of
  the monitoring namespace on the metrics port alone (Prometheus scraping /metrics). Egress stays
  open: peers, cluster DNS, and the Hugging Face hub for a model given by hub id.
- Data prep: no ingress; egress to DNS and HTTPS only (the hub, where C4 comes from).
- Results: nothing either way. It only sleeps; `kubectl cp` reaches it through the kubelet's
  exec, not the pod network.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdk8s_plus_35 import k8s

DNS_PORT = 53
HTTPS_PORT = 443


def _selector(labels: Mapping[str, str]) -> k8s.LabelSelector:
    return k8s.LabelSelector(match_labels=dict(labels))


def _port(protocol: str, port: int) -> k8s.NetworkPolicyPort:
    return k8s.NetworkPolicyPort(protocol=protocol, port=k8s.IntOrString.from_number(port))


# Kubernetes labels every namespace with its name (since 1.21): a namespace selected by name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def training(run_selector: Mapping[str, str], monitoring_namespace: str, metrics_port: int) -> k8s.NetworkPolicySpec:
    """The same run on every port; the monitoring namespace's pods on the metrics port."""
    same_run = _selector(run_selector)
    monitoring = k8s.NetworkPolicyPeer(namespace_selector=_selector({NAMESPACE_NAME_LABEL: monitoring_namespace}))
    return k8s.NetworkPolicySpec(
        pod_selector=same_run,
        policy_types=["Ingress"],
        ingress=[
            k8s.NetworkPolicyIngressRule(from_=[k8s.NetworkPolicyPeer(pod_selector=same_run)]),
            k8s.NetworkPolicyIngressRule(from_=[monitoring], ports=[_port("TCP", metrics_port)]),
        ],
    )


def dns_and_https_out(pod_selector: Mapping[str, str]) -> k8s.NetworkPolicySpec:
    ports = [_port("UDP", DNS_PORT), _port("TCP", DNS_PORT), _port("TCP", HTTPS_PORT)]
    return k8s.NetworkPolicySpec(
        pod_selector=_selector(pod_selector),
        policy_types=["Ingress", "Egress"],
        egress=[k8s.NetworkPolicyEgressRule(ports=ports)],
    )


def isolated(pod_selector: Mapping[str, str]) -> k8s.NetworkPolicySpec:
    return k8s.NetworkPolicySpec(pod_selector=_selector(pod_selector), policy_types=["Ingress", "Egress"])
