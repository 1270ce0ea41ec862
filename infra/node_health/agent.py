"""Marks a GPU node's instance Unhealthy in its Auto Scaling group when Kubernetes sees that the
node is broken, so the group replaces it within a minute or two, wedged nodes included.

Why this signal: the group's own health check is EC2's, and EC2's status checks pass on an
instance whose kubelet hangs, whose GPU raised an Xid error or whose EFA device failed. Those
show in the Node object: `Ready` stops being True (a hung kubelet stops reporting), and the EKS
node monitoring agent (an add-on on every node) sets `AcceleratedHardwareReady`,
`NetworkingReady`, `StorageReady`, `KernelReady` or `ContainerRuntimeReady` to False. EKS's own
node auto repair acts on exactly these, but only for managed node groups; this group is
self-managed (every EFA card, placement group, capacity reservation in one launch template).

The rules, every POLL_S:
- a node whose `Ready` is not True for NOT_READY_GRACE_S, once it is older than BOOT_GRACE_S
  (a booting node is NotReady until its network is up; one that never gets Ready is replaced);
- a node with a monitoring condition False for HARDWARE_GRACE_S;
- never more than MAX_AT_ONCE nodes, nor any when more than half of the group looks broken at
  once: that is the control plane or the network, and replacing every node would be the outage.

It calls one AWS API, `autoscaling:SetInstanceHealth`, which its Pod Identity role allows on
this one group only, and reads Nodes, which its ClusterRole allows (get, list). Standard library
only: it runs in a plain Python image, with Pod Identity's credentials, signed with SigV4.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import ssl
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

MONITOR_CONDITIONS = ("AcceleratedHardwareReady", "NetworkingReady", "StorageReady", "KernelReady",
                      "ContainerRuntimeReady")
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_SERVER = "https://kubernetes.default.svc"
AUTOSCALING_API_VERSION = "2011-01-01"
FORM = "application/x-www-form-urlencoded; charset=utf-8"
HTTP_TIMEOUT_S = 10.0

log = logging.getLogger("node-health")


@dataclass(frozen=True)
class Rules:
    """How long each sign must last before a node is replaced, and how many may go at once."""

    not_ready_grace_s: float = 60.0
    hardware_grace_s: float = 30.0
    boot_grace_s: float = 900.0
    max_at_once: int = 1

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Rules":
        return cls(float(env.get("NOT_READY_GRACE_S", cls.not_ready_grace_s)),
                   float(env.get("HARDWARE_GRACE_S", cls.hardware_grace_s)),
                   float(env.get("BOOT_GRACE_S", cls.boot_grace_s)),
                   int(env.get("MAX_AT_ONCE", cls.max_at_once)))


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def instance_id(node: dict) -> str | None:
    """`aws:///us-east-2c/i-0123456789abcdef0` -> `i-0123456789abcdef0`."""
    provider = node.get("spec", {}).get("providerID", "")
    last = provider.rsplit("/", 1)[-1]
    return last if provider.startswith("aws://") and last.startswith("i-") else None


def why_broken(node: dict, now: dt.datetime, rules: Rules) -> str | None:
    """The reason to replace this node now, or None."""
    conditions = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
    age = (now - _time(node["metadata"]["creationTimestamp"])).total_seconds()
    ready = conditions.get("Ready")
    if ready is not None and ready["status"] != "True" and age >= rules.boot_grace_s:
        since = (now - _time(ready["lastTransitionTime"])).total_seconds()
        if since >= rules.not_ready_grace_s:
            return f"Ready {ready['status']} for {since:.0f} s ({ready.get('reason', '')})"
    for name in MONITOR_CONDITIONS:
        cond = conditions.get(name)
        if cond is not None and cond["status"] == "False":
            since = (now - _time(cond["lastTransitionTime"])).total_seconds()
            if since >= rules.hardware_grace_s:
                return f"{name} False for {since:.0f} s ({cond.get('reason', '')}: {cond.get('message', '')})"
    return None


def to_replace(nodes: list[dict], now: dt.datetime, rules: Rules, done: set[str]) -> list[tuple[str, str, str]]:
    """(node, instance, reason) to mark Unhealthy now: at most `max_at_once`, none when more
    than half of the group looks broken (not the nodes: the control plane or the network)."""
    broken = [(n["metadata"]["name"], instance_id(n), why) for n in nodes
              if (why := why_broken(n, now, rules)) is not None]
    if nodes and len(broken) * 2 > len(nodes):
        log.warning("%d of %d nodes look broken at once: replacing none", len(broken), len(nodes))
        return []
    return [b for b in broken if b[1] is not None and b[1] not in done][: rules.max_at_once]


# --- AWS: Pod Identity credentials and a SigV4-signed Query API call ------------------------------
@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None


def pod_identity_credentials(env: dict[str, str]) -> Credentials:
    """From the EKS Pod Identity agent, at the address and with the token it injects."""
    with open(env["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"]) as f:
        token = f.read().strip()
    request = urllib.request.Request(env["AWS_CONTAINER_CREDENTIALS_FULL_URI"], headers={"Authorization": token})
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
        body = json.load(answer)
    return Credentials(body["AccessKeyId"], body["SecretAccessKey"], body.get("Token"))


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sigv4_headers(host: str, region: str, service: str, body: bytes, creds: Credentials,
                  now: dt.datetime) -> dict[str, str]:
    """Headers of a signed POST to `https://<host>/` (AWS Signature Version 4)."""
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"content-type": FORM, "host": host, "x-amz-date": amz_date}
    if creds.token:
        headers["x-amz-security-token"] = creds.token
    signed = ";".join(sorted(headers))
    canonical = "\n".join(["POST", "/", "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "",
                           signed, hashlib.sha256(body).hexdigest()])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{creds.secret_key}".encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
                                f"SignedHeaders={signed}, Signature={signature}")
    return headers


def set_instance_health_body(instance: str) -> bytes:
    return urllib.parse.urlencode({
        "Action": "SetInstanceHealth", "Version": AUTOSCALING_API_VERSION, "InstanceId": instance,
        "HealthStatus": "Unhealthy", "ShouldRespectGracePeriod": "false"}).encode()


def mark_unhealthy(instance: str, region: str, creds: Credentials) -> None:
    host = f"autoscaling.{region}.amazonaws.com"
    body = set_instance_health_body(instance)
    headers = sigv4_headers(host, region, "autoscaling", body, creds, dt.datetime.now(dt.UTC))
    request = urllib.request.Request(f"https://{host}/", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S):
        pass


# --- Kubernetes ------------------------------------------------------------------------------------
def list_nodes(selector: str) -> list[dict]:
    with open(f"{SERVICE_ACCOUNT_DIR}/token") as f:
        token = f.read().strip()
    context = ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT_DIR}/ca.crt")
    url = f"{API_SERVER}/api/v1/nodes?" + urllib.parse.urlencode({"labelSelector": selector})
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S, context=context) as answer:
        return json.load(answer)["items"]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    env = dict(os.environ)
    rules, region, selector = Rules.from_env(env), env["AWS_REGION"], env["NODE_SELECTOR"]
    poll_s = float(env.get("POLL_S", "10"))
    done: set[str] = set()  # marked already: the group terminates them
    log.info("watching nodes %s of region %s: %s", selector, region, rules)
    while True:
        try:
            for node, instance, why in to_replace(list_nodes(selector), dt.datetime.now(dt.UTC), rules, done):
                log.warning("node %s (%s): %s; marking it Unhealthy", node, instance, why)
                mark_unhealthy(instance, region, pod_identity_credentials(env))
                done.add(instance)
        except Exception as exc:  # noqa: BLE001 - a failed poll is retried; the agent must not die
            log.error("poll failed: %s", exc)
        time.sleep(poll_s)


if __name__ == "__main__":
    main()
