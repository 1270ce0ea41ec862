"""NetworkPolicies: every pod is selected by exactly one, which admits only what the pod needs."""

from __future__ import annotations


def pods(synthesis) -> dict[str, dict[str, str]]:
    """component -> the labels of its pods."""
    return {
        "train": synthesis.job["spec"]["template"]["metadata"]["labels"],
        "data-prep": synthesis.one("Job", "data-prep")["spec"]["template"]["metadata"]["labels"],
        "results": synthesis.one("Pod", "results")["metadata"]["labels"],
    }


def selects(policy: dict, labels: dict[str, str]) -> bool:
    return policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_every_pod_is_selected_by_exactly_its_own_policy(synthesis) -> None:
    policies = [d for d in synthesis.docs() if d["kind"] == "NetworkPolicy"]
    for component, labels in pods(synthesis).items():
        (policy,) = [p for p in policies if selects(p, labels)]
        assert policy["metadata"]["labels"]["app.kubernetes.io/component"] == component
        assert policy["metadata"]["namespace"] == synthesis.dep.namespace


def test_training_ingress_only_from_the_same_run_on_all_ports(synthesis) -> None:
    policy = synthesis.one("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"]["nvrx-eks/run-id"] == synthesis.dep.run_id
    assert policy["policyTypes"] == ["Ingress"]  # egress stays open (DNS, Hugging Face hub)
    assert len(policy["ingress"]) == 1
    rule = policy["ingress"][0]
    assert "ports" not in rule  # NCCL bootstrap listens on ephemeral ports
    assert rule["from"] == [{"podSelector": policy["podSelector"]}]


def test_data_prep_receives_nothing_and_sends_only_dns_and_https(synthesis) -> None:
    policy = synthesis.one("NetworkPolicy", "data-prep")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy
    (rule,) = policy["egress"]
    assert "to" not in rule  # the hub's addresses are not known in advance
    assert sorted((p["protocol"], p["port"]) for p in rule["ports"]) == [("TCP", 53), ("TCP", 443), ("UDP", 53)]


def test_results_pod_is_isolated_both_ways(synthesis) -> None:
    policy = synthesis.one("NetworkPolicy", "results")
    assert policy["metadata"]["name"] == synthesis.one("Pod", "results")["metadata"]["name"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]
