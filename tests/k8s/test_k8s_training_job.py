"""The essentials of the training run: gang shape, rank-0 address, resources, security, storage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from config import instance_spec
from config.contract import TERMINATION_GRACE_FLOOR_S
from config.training import pod_owned
from k8s import naming
from k8s.resources import SYSTEM_MEMORY_FRACTION, shm_size_gib
from scripts.plan import make_plan


def test_indexed_job_spans_every_node(synthesis) -> None:
    spec = synthesis.job["spec"]
    nodes = synthesis.dep.profile.node_count + synthesis.dep.profile.spare_nodes
    assert spec["completionMode"] == "Indexed"
    assert spec["parallelism"] == spec["completions"] == nodes


def test_subdomain_pairs_with_headless_service(synthesis) -> None:
    service = synthesis.one("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert synthesis.pod_spec["subdomain"] == service["metadata"]["name"]
    pod_labels = synthesis.job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert naming.RENDEZVOUS_PORT in {p["port"] for p in service["spec"]["ports"]}


def test_the_stores_address_is_the_store_service_or_the_first_index(synthesis) -> None:
    job_name = synthesis.job["metadata"]["name"]
    if synthesis.dep.external_store:
        store = synthesis.one("Service", naming.COMPONENT_STORE)["metadata"]
        assert synthesis.args_value("--master_addr") == f"{store['name']}.{store['namespace']}.svc"
    else:
        service_name = synthesis.one("Service")["metadata"]["name"]
        assert synthesis.args_value("--master_addr") == f"{job_name}-0.{service_name}"
    assert synthesis.args_value("--master_port") == str(naming.RENDEZVOUS_PORT)


def test_node_rank_comes_from_the_completion_index(synthesis) -> None:
    env = synthesis.env[naming.COMPLETION_INDEX_ENV]
    path = env["valueFrom"]["fieldRef"]["fieldPath"]
    assert path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert synthesis.args_value("--node_rank") == "$(JOB_COMPLETION_INDEX)"
    assert synthesis.args_value("--nnodes") == str(synthesis.dep.profile.node_count)


def test_one_pod_per_node(synthesis) -> None:
    terms = synthesis.pod_spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms) == 1
    assert terms[0]["topologyKey"] == "kubernetes.io/hostname"
    pod_labels = synthesis.job["spec"]["template"]["metadata"]["labels"]
    assert terms[0]["labelSelector"]["matchLabels"].items() <= pod_labels.items()


def test_device_resources_match_the_instance_table(synthesis) -> None:
    spec = instance_spec(synthesis.dep.profile.instance_type)
    res = synthesis.trainer["resources"]
    for section in ("requests", "limits"):
        assert res[section]["nvidia.com/gpu"] == spec.gpus
        if spec.efa_interfaces:
            assert res[section]["vpc.amazonaws.com/efa"] == spec.efa_interfaces
            assert res[section]["hugepages-2Mi"] == "5120Mi"
        else:
            assert "vpc.amazonaws.com/efa" not in res[section]
            assert "hugepages-2Mi" not in res[section]
    assert synthesis.args_value("--nproc_per_node") == str(spec.gpus)


def test_cpu_and_memory_leave_headroom(synthesis) -> None:
    spec = instance_spec(synthesis.dep.profile.instance_type)
    requests = synthesis.trainer["resources"]["requests"]
    memory_gib = int(requests["memory"].removesuffix("Gi"))
    assert 0 < requests["cpu"] < spec.vcpus
    assert memory_gib <= spec.memory_gib * (1 - SYSTEM_MEMORY_FRACTION)
    assert memory_gib >= 2 * shm_size_gib(synthesis.dep.profile)
    assert synthesis.trainer["resources"]["limits"]["memory"] == requests["memory"]
    assert "cpu" not in synthesis.trainer["resources"]["limits"]


def test_shm_is_a_bounded_memory_volume(synthesis) -> None:
    volumes = {v["name"]: v for v in synthesis.pod_spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in synthesis.trainer["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert shm["emptyDir"]["sizeLimit"] == f"{shm_size_gib(synthesis.dep.profile):g}Gi"
    assert not any("hostPath" in v and v["hostPath"]["path"] == "/dev/shm" for v in volumes.values())


def test_trainer_security_context(synthesis) -> None:
    sc = synthesis.trainer["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert synthesis.pod_spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    if synthesis.dep.has_efa:
        # IPC_LOCK is effective only for uid 0 (no ambient capabilities in Kubernetes).
        assert sc["capabilities"]["add"] == ["IPC_LOCK"]
        assert sc["runAsUser"] == 0
    else:
        assert "add" not in sc["capabilities"]
        assert sc["runAsNonRoot"] is True


def test_every_container_drops_all_capabilities(synthesis) -> None:
    allowed = {"IPC_LOCK", "CHOWN", "DAC_OVERRIDE"}
    for doc in synthesis.docs():
        if doc["kind"] not in ("Job", "Pod"):
            continue
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            sc = container["securityContext"]
            assert sc["capabilities"]["drop"] == ["ALL"], container["name"]
            assert set(sc["capabilities"].get("add", [])) <= allowed, container["name"]
            assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert spec["automountServiceAccountToken"] is False
        assert spec.get("hostNetwork") is None and spec.get("hostIPC") is None


def test_gpu_node_selection_and_toleration(synthesis) -> None:
    assert synthesis.pod_spec["nodeSelector"] == {
        "nvrx-eks/node-group": "gpu",
        "node.kubernetes.io/instance-type": synthesis.dep.profile.instance_type,
    }
    assert {
        "key": "nvidia.com/gpu",
        "operator": "Equal",
        "value": "true",
        "effect": "NoSchedule",
    } in synthesis.pod_spec["tolerations"]


def test_fsx_claim_mounted_at_profile_path(synthesis) -> None:
    volumes = {v["name"]: v for v in synthesis.pod_spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in synthesis.trainer["volumeMounts"]}
    mount_path = synthesis.dep.profile.storage.mount_path
    assert volumes[mounts[mount_path]]["persistentVolumeClaim"]["claimName"] == "fsx-claim"


def test_every_run_writes_under_its_own_directory(synthesis) -> None:
    run_dir = f"{synthesis.dep.profile.storage.mount_path}/runs/{synthesis.dep.run_id}"
    assert synthesis.args_value("--checkpoint_dir") == f"{run_dir}/checkpoints"
    assert synthesis.args_value("--results_path") == f"{run_dir}/results.json"
    assert synthesis.env["NVRX_RUN_DIR"]["value"] == run_dir
    init_script = synthesis.pod_spec["initContainers"][0]["command"][-1]
    assert f"mkdir -p {run_dir} {run_dir}/checkpoints" in init_script


def test_settings_config_map_records_the_run(synthesis) -> None:
    settings = json.loads(synthesis.one("ConfigMap")["data"]["settings.json"])
    assert settings["run_id"] == synthesis.dep.run_id
    assert settings["mode"] == synthesis.dep.mode
    assert settings["profile"]["trainer"]["max_steps"] == synthesis.dep.profile.trainer.max_steps
    assert settings["trainer_args"] == synthesis.trainer["args"][synthesis.trainer["args"].index("--") + 1 :]


def test_trainer_flags_follow_the_profile(synthesis) -> None:
    from trainer.config import parse_args

    dep, t = synthesis.dep, synthesis.dep.profile.trainer
    assert synthesis.args_value("--model") == t.model
    assert synthesis.args_value("--max_steps") == str(t.max_steps)
    assert synthesis.args_value("--checkpoint_interval") == str(t.checkpoint_interval)
    assert synthesis.args_value("--tiers") == ",".join(t.tiers)
    assert synthesis.args_value("--node_dir") == "/dev/shm/nvrx"
    assert synthesis.args_value("--data_path") == dep.data_dir
    assert dep.data_dir.startswith(f"{dep.profile.storage.mount_path}/data/")
    trainer_args = synthesis.trainer["args"][synthesis.trainer["args"].index("--") + 1:]
    # Every setting reaches the pod: what the trainer parses there is the profile's, whole.
    assert parse_args([*trainer_args, "--mode", dep.mode]) == dep.train
    assert dep.train.model_dump(exclude=set(pod_owned())) == t.model_dump()


def test_the_hf_token_is_a_mounted_file_never_an_env_var(synthesis) -> None:
    data_prep = synthesis.one("Job", "data-prep")["spec"]["template"]["spec"]
    for spec in (synthesis.pod_spec, data_prep):
        (container,) = spec["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in env.values())
        assert "HF_TOKEN" not in env
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volume = {v["name"]: v for v in spec["volumes"]}["hf-token"]
        assert volume["secret"] == {"secretName": "hf-token", "items": [{"key": "token", "path": "token"}],
                                    "optional": True}
        assert mounts["hf-token"]["readOnly"] is True
        assert env["HF_TOKEN_PATH"]["value"] == f"{mounts['hf-token']['mountPath']}/token"


def test_huggingface_hub_reads_the_token_from_the_path_the_pods_set(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_probe_token\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env |= {"HF_HOME": str(tmp_path / "home"), "HF_TOKEN_PATH": str(token)}
    code = "import huggingface_hub; print(huggingface_hub.get_token())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "hf_probe_token", proc.stderr[-2000:]


def test_no_secret_values_anywhere(synthesis) -> None:
    text = json.dumps(synthesis.docs())
    for marker in ("hf_", "AKIA", "BEGIN PRIVATE KEY", "aws_secret_access_key"):
        assert marker not in text
    assert all(d["kind"] != "Secret" for d in synthesis.docs())


def test_every_container_uses_the_run_image(synthesis) -> None:
    for doc in synthesis.docs():
        if doc["kind"] in ("Job", "Pod"):
            spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                assert container["image"] == synthesis.dep.image.reference
                # The fixtures use the default: the commit's tag in the stack's repository.
                assert container["imagePullPolicy"] == "IfNotPresent"


def test_the_other_containers_have_cpu_and_memory_limits(synthesis) -> None:
    """Init, data-prep and results containers share a GPU node with a trainer: each is bounded."""
    data_prep = synthesis.one("Job", "data-prep")["spec"]["template"]["spec"]
    results = synthesis.one("Pod", "results")["spec"]
    others = [*synthesis.pod_spec["initContainers"], *data_prep["initContainers"], *data_prep["containers"],
              *results["containers"]]
    for container in others:
        limits = container["resources"]["limits"]
        assert {"cpu", "memory"} <= limits.keys(), container["name"]
        assert limits["memory"] == container["resources"]["requests"]["memory"]


def test_the_grace_period_holds_a_checkpoint_write_and_the_trainer_is_given_it(synthesis) -> None:
    """SIGTERM to SIGKILL: the ranks commit their newest state within it. Sized from the write
    time that `nvrx-eks plan` reports, and handed to the trainer to the second."""
    grace = synthesis.pod_spec["terminationGracePeriodSeconds"]
    plan = make_plan(synthesis.dep.profile)
    assert grace == plan.termination_grace_seconds >= TERMINATION_GRACE_FLOOR_S
    assert grace > plan.write_seconds(plan.current)
    assert synthesis.args_value("--termination_grace") == str(grace)
