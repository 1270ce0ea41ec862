"""NetworkPolicies: every pod is selected by exactly one, which admits only what the pod needs."""

from __future__ import annotations

import pytest

from config.contract import METRICS_PORT


def pods(synthesis) -> dict[str, dict[str, str]]:
    """component -> the labels of its pods."""
    return {
        "train": synthesis.job["spec"]["template"]["metadata"]["labels"],
        "data-prep": synthesis.one("Job", "data-prep")["spec"]["template"]["metadata"]["labels"],
        "results": synthesis.one("Pod", "results")["metadata"]["labels"],
        "watch": synthesis.one("Pod", "watch")["metadata"]["labels"],
    }


def selects(policy: dict, labels: dict[str, str]) -> bool:
    return policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_every_pod_is_selected_by_exactly_its_own_policy(synthesis) -> None:
    policies = [d for d in synthesis.docs() if d["kind"] == "NetworkPolicy"]
    for component, labels in pods(synthesis).items():
        (policy,) = [p for p in policies if selects(p, labels)]
        assert policy["metadata"]["labels"]["app.kubernetes.io/component"] == component
        assert policy["metadata"]["namespace"] == synthesis.dep.namespace


def test_training_ingress_from_the_same_run_on_all_ports_and_the_scraper_on_the_metrics_port(synthesis) -> None:
    policy = synthesis.one("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"]["nvrx-eks/run-id"] == synthesis.dep.run_id
    assert policy["policyTypes"] == ["Ingress"]  # egress stays open (DNS, Hugging Face hub)
    same_run, scraper = policy["ingress"]
    assert "ports" not in same_run  # NCCL bootstrap listens on ephemeral ports
    assert same_run["from"] == [{"podSelector": policy["podSelector"]}]
    # The monitoring namespace's pods, by the name label Kubernetes gives every namespace; one
    # port, the one the launcher serves /metrics on and the pods' annotations name.
    namespace = synthesis.dep.profile.observability.monitoring_namespace
    assert scraper["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}]
    assert scraper["ports"] == [{"port": METRICS_PORT, "protocol": "TCP"}]
    annotations = synthesis.job["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                           "prometheus.io/path": "/metrics"}
    assert {"name": "metrics", "containerPort": METRICS_PORT} in synthesis.trainer["ports"]
    assert synthesis.args_value("--metrics_port") == str(METRICS_PORT)


def test_data_prep_receives_nothing_and_sends_only_dns_and_https(synthesis) -> None:
    policy = synthesis.one("NetworkPolicy", "data-prep")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy
    (rule,) = policy["egress"]
    assert "to" not in rule  # the hub's addresses are not known in advance
    assert sorted((p["protocol"], p["port"]) for p in rule["ports"]) == [("TCP", 53), ("TCP", 443), ("UDP", 53)]


@pytest.mark.parametrize("component", ["results", "watch"])
def test_the_reading_pods_are_isolated_both_ways(synthesis, component) -> None:
    policy = synthesis.one("NetworkPolicy", component)
    assert policy["metadata"]["name"] == synthesis.one("Pod", component)["metadata"]["name"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]


def test_export_receives_nothing_and_sends_only_dns_and_https(synthesis) -> None:
    job = synthesis.one("Job", "export")
    (policy,) = [d for d in synthesis.docs() if d["kind"] == "NetworkPolicy"
                 and d["metadata"]["name"] == job["metadata"]["name"]]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy["spec"]


def test_a_pod_monitor_scrapes_the_run_s_pods_by_its_selector_and_port_name(outputs_file) -> None:
    """With `observability.pod_monitor`, the run's manifest has the Prometheus operator's
    PodMonitor (its CRD's schema is not bundled: its structure is checked here, every other
    object by kubernetes-validate)."""
    import kubernetes_validate

    from config import load_profile
    from k8s import synth
    from k8s.deployment import resolve
    from k8s.outputs import load_outputs

    base = load_profile("p5")
    profile = base.model_copy(update={"observability": base.observability.model_copy(
        update={"pod_monitor": True, "monitoring_namespace": "prometheus"})})
    dep = resolve(profile, load_outputs(outputs_file("p5")), mode="baseline", run_id="pm-test")
    train = synth.build(dep, (synth.TRAIN,))[synth.file_name(synth.TRAIN, dep.run_id)]
    (monitor,) = [d for d in train if d["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"] == {"name": dep.job_name, "namespace": dep.namespace,
                                   "labels": next(d for d in train if d["kind"] == "Job")["metadata"]["labels"]}
    job = next(d for d in train if d["kind"] == "Job")
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in job["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports[endpoint["port"]] == METRICS_PORT and endpoint["path"] == "/metrics"
    assert monitor["spec"]["podTargetLabels"] == ["nvrx-eks/run-id", "batch.kubernetes.io/job-completion-index"]
    policy = next(d for d in train if d["kind"] == "NetworkPolicy")["spec"]
    assert policy["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "prometheus"}
    for doc in (d for d in train if d["kind"] != "PodMonitor"):
        kubernetes_validate.validate(doc, "1.35.0", strict=True)
