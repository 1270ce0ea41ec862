"""The NetworkPolicy isolates one run: ingress only from the same run's pods, on every port."""

from __future__ import annotations


def test_policy_selects_the_run_pods(synthesis) -> None:
    policy = synthesis.one("NetworkPolicy")["spec"]
    pod_labels = synthesis.job["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["podSelector"]["matchLabels"]["nvrx-eks/run-id"] == synthesis.dep.run_id


def test_ingress_only_from_the_same_run_on_all_ports(synthesis) -> None:
    policy = synthesis.one("NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress"]  # egress stays open (DNS, Hugging Face hub)
    assert len(policy["ingress"]) == 1
    rule = policy["ingress"][0]
    assert "ports" not in rule  # NCCL bootstrap listens on ephemeral ports
    assert rule["from"] == [{"podSelector": policy["podSelector"]}]


def test_data_prep_results_and_export_pods_are_not_selected(synthesis) -> None:
    selector = synthesis.one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"]
    for component, kind in (("data-prep", "Job"), ("results", "Pod"), ("export", "Job")):
        doc = synthesis.one(kind, component)
        labels = doc["spec"]["template"]["metadata"]["labels"] if kind == "Job" else doc["metadata"]["labels"]
        assert not selector.items() <= labels.items()
