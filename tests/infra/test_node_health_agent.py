"""The node-health agent's rules and its AWS request, without a cluster: which nodes it marks
Unhealthy, that it never marks many at once, and that its SigV4 signature is botocore's."""

from __future__ import annotations

import datetime as dt
import urllib.parse

import botocore.auth
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials

from infra.node_health.agent import (FORM, Credentials, Rules, instance_id, set_instance_health_body,
                                     sigv4_headers, to_replace, why_broken)

NOW = dt.datetime(2026, 12, 2, 12, 0, 0, tzinfo=dt.UTC)
RULES = Rules(not_ready_grace_s=60, hardware_grace_s=30, boot_grace_s=900, max_at_once=1)


def stamp(seconds_ago: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, age_s: float = 3600, **conditions: tuple[str, float]) -> dict:
    """A Node object: conditions as type=(status, seconds since it changed)."""
    conditions.setdefault("Ready", ("True", age_s))
    return {
        "metadata": {"name": name, "creationTimestamp": stamp(age_s)},
        "spec": {"providerID": f"aws:///us-east-2c/i-{name}"},
        "status": {"conditions": [{"type": t, "status": st, "lastTransitionTime": stamp(since),
                                   "reason": "R", "message": "M"} for t, (st, since) in conditions.items()]},
    }


def test_instance_id_from_the_provider_id() -> None:
    assert instance_id(node("0abc")) == "i-0abc"
    assert instance_id({"spec": {"providerID": "kind://docker/x"}}) is None
    assert instance_id({"spec": {}}) is None


@pytest.mark.parametrize("conditions, age_s, broken", [
    ({}, 3600, False),
    ({"Ready": ("Unknown", 59)}, 3600, False),           # not yet past the grace
    ({"Ready": ("Unknown", 61)}, 3600, True),            # a hung kubelet stops reporting
    ({"Ready": ("False", 61)}, 3600, True),
    ({"Ready": ("False", 300)}, 600, False),             # still booting
    ({"Ready": ("False", 901)}, 901, True),              # never got Ready
    ({"AcceleratedHardwareReady": ("False", 31)}, 3600, True),   # a GPU Xid error
    ({"AcceleratedHardwareReady": ("False", 29)}, 3600, False),
    ({"NetworkingReady": ("False", 31)}, 120, True),     # EFA: a hardware condition needs no boot grace
    ({"AcceleratedHardwareReady": ("True", 31)}, 3600, False),
    ({"SomeOtherCondition": ("False", 999)}, 3600, False),
])  # fmt: skip
def test_which_node_is_broken(conditions: dict, age_s: float, broken: bool) -> None:
    assert (why_broken(node("a", age_s, **conditions), NOW, RULES) is not None) is broken


def test_one_node_at_a_time_and_never_twice() -> None:
    nodes = [node("a", Ready=("Unknown", 120)), node("b", KernelReady=("False", 60)),
             *(node(f"ok{i}") for i in range(6))]
    first = to_replace(nodes, NOW, RULES, done=set())
    assert [(n, i) for n, i, _ in first] == [("a", "i-a")]
    assert [(n, i) for n, i, _ in to_replace(nodes, NOW, RULES, done={"i-a"})] == [("b", "i-b")]
    assert to_replace(nodes, NOW, RULES, done={"i-a", "i-b"}) == []


def test_half_the_group_broken_at_once_is_not_the_nodes() -> None:
    """A control-plane or network outage makes every node look NotReady: replacing them would
    be the outage. Half of them is still acted on; more is not."""
    half = [node(f"n{i}", Ready=("Unknown", 120)) for i in range(2)] + [node("x"), node("y")]
    assert len(to_replace(half, NOW, RULES, done=set())) == 1
    most = [node(f"n{i}", Ready=("Unknown", 120)) for i in range(3)] + [node("x")]
    assert to_replace(most, NOW, RULES, done=set()) == []


def test_the_rules_come_from_the_environment() -> None:
    rules = Rules.from_env({"NOT_READY_GRACE_S": "5", "HARDWARE_GRACE_S": "6", "BOOT_GRACE_S": "7",
                            "MAX_AT_ONCE": "2"})
    assert rules == Rules(5.0, 6.0, 7.0, 2)
    assert Rules.from_env({}) == Rules()


@pytest.mark.parametrize("token", [None, "session-token"])
def test_the_signature_is_botocores(token: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request the agent sends, signed by hand, equals botocore's SigV4 signature of it."""
    body = set_instance_health_body("i-0123456789abcdef0")
    assert urllib.parse.parse_qs(body.decode()) == {
        "Action": ["SetInstanceHealth"], "Version": ["2011-01-01"], "InstanceId": ["i-0123456789abcdef0"],
        "HealthStatus": ["Unhealthy"], "ShouldRespectGracePeriod": ["false"]}
    host = "autoscaling.us-east-2.amazonaws.com"
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    ours = sigv4_headers(host, "us-east-2", "autoscaling", body, creds, NOW)
    request = AWSRequest(method="POST", url=f"https://{host}/", data=body,
                         headers={"Content-Type": FORM, "X-Amz-Date": ours["x-amz-date"]})
    signer = SigV4Auth(BotoCredentials(creds.access_key, creds.secret_key, token), "autoscaling", "us-east-2")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))  # same instant
    signer.add_auth(request)
    assert ours["authorization"] == request.headers["Authorization"]
