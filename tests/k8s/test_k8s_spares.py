"""Hot spares, shrinking and the store pod: N + K training pods, the launcher's node range, the
store's Deployment, Service, disruption budget and NetworkPolicy, the replacement policy, and
what synthesis refuses (exit 2, one line)."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from config import RecoveryMode, contract, load_profile, profile_from_dict
from config.versions import DEFAULT_EKS_VERSION, EXTENDED_SUPPORT_ONLY
from k8s import naming, synth
from k8s.deployment import resolve
from k8s.errors import SynthError
from tests.k8s.conftest import outputs_of

REPO = Path(__file__).resolve().parents[2]
VERSIONS = (f"{EXTENDED_SUPPORT_ONLY[0]}.0", f"{DEFAULT_EKS_VERSION}.0", latest_version())
FT_MODES = tuple(m.value for m in RecoveryMode if m.launcher_restarts_workers)
TORCHRUN_MODES = tuple(m.value for m in RecoveryMode if not m.launcher_restarts_workers)
WORKLOADS = ("job", "jobset")


def spare_profile(workload: str = "job", **changes):
    """p5 (2 nodes) with one hot spare, as a profile file would give it."""
    data = load_profile("p5").model_dump(mode="json") | {"spare_nodes": 1, "workload": workload} | changes
    return profile_from_dict(data)


@cache
def spare_synthesis(mode: str, workload: str) -> tuple:
    profile = spare_profile(workload)
    dep = resolve(profile, outputs_of(profile), mode=mode, run_id=f"spare-{workload}")
    return dep, synth.build(dep)


def train_docs(mode: str, workload: str) -> list[dict]:
    dep, manifests = spare_synthesis(mode, workload)
    return manifests[synth.file_name(synth.TRAIN, dep.run_id)]


def one(docs: list[dict], kind: str, component: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["labels"][naming.LABEL_COMPONENT] == component]
    assert len(found) == 1, f"{kind}/{component}: {len(found)}"
    return found[0]


def job_spec(docs: list[dict], workload: str) -> dict:
    if workload == "job":
        return one(docs, "Job", naming.COMPONENT_TRAIN)["spec"]
    (jobset,) = [d for d in docs if d["kind"] == "JobSet"]
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]


def launcher_args(spec: dict) -> list[str]:
    return spec["template"]["spec"]["containers"][0]["args"]


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("mode", FT_MODES)
def test_n_plus_k_pods_and_the_launchers_node_range(mode: str, workload: str) -> None:
    dep, _ = spare_synthesis(mode, workload)
    spec = job_spec(train_docs(mode, workload), workload)
    assert spec["completions"] == spec["parallelism"] == 3  # 2 training nodes + 1 spare
    args = launcher_args(spec)
    assert (value(args, "--nnodes"), value(args, "--min_nodes"), value(args, "--spare_nodes")) == ("2", "2", "1")
    assert value(args, "--node_rank") == f"$({naming.COMPLETION_INDEX_ENV})"  # in [0, N + K)
    assert "--external_store" in args[: args.index("--")]
    assert value(args, "--master_addr") == f"train-spare-{workload}-store.{dep.namespace}.svc"
    assert value(args, "--master_port") == str(naming.RENDEZVOUS_PORT)


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("mode", FT_MODES)
def test_a_lost_pods_replacement_starts_at_once(mode: str, workload: str) -> None:
    """TerminatingOrFailed, which Kubernetes allows only without a podFailurePolicy; in a JobSet
    the child Job replaces the pod itself instead of failing and restarting the whole run."""
    dep, _ = spare_synthesis(mode, workload)
    spec = job_spec(train_docs(mode, workload), workload)
    assert spec["podReplacementPolicy"] == "TerminatingOrFailed"
    assert "podFailurePolicy" not in spec
    assert spec["backoffLimit"] == dep.profile.recovery.backoff_limit * 3
    if workload == "jobset":
        (jobset,) = [d for d in train_docs(mode, workload) if d["kind"] == "JobSet"]
        assert jobset["spec"]["failurePolicy"] == {"maxRestarts": dep.profile.recovery.backoff_limit}


def test_replacement_policy_and_failure_policy_never_meet(synthesis) -> None:
    """The API server refuses a Job with a podFailurePolicy and podReplacementPolicy other than
    Failed; kubernetes-validate's schemas cannot see it."""
    spec = synthesis.job["spec"]
    if "podFailurePolicy" in spec:
        assert spec["podReplacementPolicy"] == "Failed"
    expected = "TerminatingOrFailed" if synthesis.dep.recovery_mode.launcher_restarts_workers else "Failed"
    assert spec["podReplacementPolicy"] == expected


@pytest.mark.parametrize("mode", FT_MODES)
def test_the_store_pod(mode: str) -> None:
    dep, _ = spare_synthesis(mode, "job")
    docs = train_docs(mode, "job")
    name = f"train-{dep.run_id}-store"
    deployment = one(docs, "Deployment", naming.COMPONENT_STORE)
    assert deployment["metadata"]["name"] == name
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {naming.NODE_GROUP_LABEL: naming.NODE_GROUP_SYSTEM}
    assert "tolerations" not in pod and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    launcher = launcher_args(job_spec(docs, "job"))
    assert [*container["command"], *container["args"]] == [
        "python", "-m", "trainer.recovery.store_server", "--master_port", str(naming.RENDEZVOUS_PORT),
        "--host", "0.0.0.0", "--nnodes", "2", "--min_nodes", "2", "--spare_nodes", "1",
        "--rdzv_join_timeout", value(launcher, "--rdzv_join_timeout")]  # fmt: skip
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] != 0 and security["readOnlyRootFilesystem"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    assert container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"]
    store_ports = list(range(naming.RENDEZVOUS_PORT, naming.RENDEZVOUS_PORT + contract.PORTS_PER_JOB))
    assert [p["containerPort"] for p in container["ports"]] == store_ports
    assert container["readinessProbe"]["tcpSocket"]["port"] == naming.RENDEZVOUS_PORT
    # the Service the launchers dial, selecting the store pod and no training pod
    service = one(docs, "Service", naming.COMPONENT_STORE)
    assert service["metadata"]["name"] == name and service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [p["port"] for p in service["spec"]["ports"]] == store_ports
    training_pod_labels = job_spec(docs, "job")["template"]["metadata"]["labels"]
    assert not set(service["spec"]["selector"].items()) <= set(training_pod_labels.items())
    budget = one(docs, "PodDisruptionBudget", naming.COMPONENT_STORE)
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    # the store is applied before the training pods
    kinds = [d["kind"] for d in docs]
    assert kinds.index("Deployment") < kinds.index("Job")


@pytest.mark.parametrize("mode", FT_MODES)
def test_the_stores_network_policy_admits_the_runs_trainers_on_the_store_ports_only(mode: str) -> None:
    dep, _ = spare_synthesis(mode, "job")
    docs = train_docs(mode, "job")
    policy = one(docs, "NetworkPolicy", naming.COMPONENT_STORE)["spec"]
    deployment = one(docs, "Deployment", naming.COMPONENT_STORE)
    assert policy["podSelector"] == deployment["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and "egress" not in policy  # it sends nothing
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": naming.run_selector(dep.run_id)}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": p} for p in
                             range(naming.RENDEZVOUS_PORT, naming.RENDEZVOUS_PORT + contract.PORTS_PER_JOB)]
    # the training pods' own policy does not select the store pod
    training = [d for d in docs if d["kind"] == "NetworkPolicy" and d is not one(docs, "NetworkPolicy", "store")]
    store_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for d in training:
        assert not set(d["spec"]["podSelector"]["matchLabels"].items()) <= set(store_labels.items())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("mode", FT_MODES)
def test_spare_manifests_validate_strictly(mode: str, workload: str, version: str) -> None:
    _, manifests = spare_synthesis(mode, workload)
    for docs in manifests.values():
        for doc in docs:
            if doc["kind"] == "JobSet":  # its CRD schema is not bundled: its Job is checked
                doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "child"},
                       "spec": doc["spec"]["replicatedJobs"][0]["template"]["spec"]}
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("mode", TORCHRUN_MODES)
def test_torchrun_modes_keep_node_zero_and_no_store(synth_for, mode: str) -> None:
    synthesis = synth_for("p5", mode)
    args = synthesis.trainer["args"]
    assert not {"--external_store", "--min_nodes", "--spare_nodes"} & set(args)
    assert synthesis.args_value("--master_addr") == f"{synthesis.dep.job_name}-0.{synthesis.dep.service_name}"
    assert not [d for d in synthesis.docs() if d["metadata"]["labels"].get(naming.LABEL_COMPONENT) == "store"]


@pytest.mark.parametrize("mode", FT_MODES)
def test_ft_launcher_modes_always_use_the_store(synth_for, mode: str) -> None:
    """No opt-out: without spares too, no training node hosts a store."""
    synthesis = synth_for("p5", mode)
    assert "--external_store" in synthesis.trainer["args"]
    assert (synthesis.args_value("--min_nodes"), synthesis.args_value("--spare_nodes")) == ("2", "0")
    assert synthesis.job["spec"]["completions"] == 2
    assert synthesis.one("Deployment", naming.COMPONENT_STORE)


@pytest.mark.parametrize("mode", TORCHRUN_MODES)
@pytest.mark.parametrize("changes, what", [({"spare_nodes": 1}, "spare_nodes 1"),
                                           ({"min_nodes": 1}, "min_nodes 1 below node_count 2")])
def test_torchrun_modes_refuse_spares_and_shrinking(mode: str, changes: dict, what: str) -> None:
    profile = profile_from_dict(load_profile("p5").model_dump(mode="json") | changes)
    with pytest.raises(SynthError) as err:
        resolve(profile, outputs_of(profile), mode=mode, run_id="r1")
    text = str(err.value)
    assert what in text and mode in text and "ft_launcher" in text and "\n" not in text


def shrinking(node_count: int, min_nodes: int, global_batch: int, batch: int = 1,
              nvrx_version: str = "0.4.1"):
    """p5 (8 GPUs a node) that may shrink, on an image whose NVRx lets it (0.4.1)."""
    base = load_profile("p5").model_dump(mode="json")
    trainer = base["trainer"] | {"global_batch_size": global_batch, "batch_size": batch}
    return profile_from_dict(base | {"node_count": node_count, "min_nodes": min_nodes,
                                     "trainer": trainer, "nvrx_version": nvrx_version})


@pytest.mark.parametrize("nvrx_version, shrinks", [("0.4.1", True), ("0.5.0", True),
                                                   ("0.6.0", False), ("0.7.0", False)])
def test_shrinking_needs_an_image_whose_nvrx_lets_the_world_shrink(nvrx_version: str, shrinks: bool) -> None:
    profile = shrinking(2, 1, 0, nvrx_version=nvrx_version)
    if shrinks:
        dep = resolve(profile, outputs_of(profile), mode="ft_launcher", run_id="r1")
        args = launcher_args(job_spec(synth.build(dep)[synth.file_name(synth.TRAIN, "r1")], "job"))
        assert value(args, "--min_nodes") == "1"
        return
    with pytest.raises(SynthError) as err:
        resolve(profile, outputs_of(profile), mode="ft_launcher", run_id="r1")
    text = str(err.value)
    assert f"nvrx_version {nvrx_version}" in text and "min_nodes 1" in text and "\n" not in text


def test_spares_need_no_particular_nvrx() -> None:
    profile = spare_profile(nvrx_version="0.7.0")
    resolve(profile, outputs_of(profile), mode="ft_launcher", run_id="r1")


@pytest.mark.parametrize("bad", ["0.3.0", "0.8.0", "0.7", "latest"])
def test_an_nvrx_version_the_trainer_does_not_run_on_is_a_profile_error(bad: str) -> None:
    from config import ProfileError

    with pytest.raises(ProfileError, match=f"nvrx_version '{bad}'"):
        profile_from_dict(load_profile("p5").model_dump(mode="json") | {"nvrx_version": bad})


@pytest.mark.parametrize("nodes, floor, global_batch", [(3, 2, 48), (2, 1, 0), (4, 2, 96)])
def test_a_global_batch_every_world_divides_is_accepted(nodes: int, floor: int, global_batch: int) -> None:
    """48 over 24 and 16 ranks; 0 on 2 nodes is 16, over 16 and 8; 96 over 32, 24 and 16."""
    profile = shrinking(nodes, floor, global_batch)
    resolve(profile, outputs_of(profile), mode="ft_launcher", run_id="r1")


@pytest.mark.parametrize("nodes, floor, global_batch, shrunk, world", [
    (4, 3, 64, 3, 24),  # 64 over 32 ranks, not over 24
    (4, 2, 0, 3, 24),   # 0: 1 x 32 = 32 at the start; 24 ranks come first on the way down
    (5, 4, 80, 4, 32),  # 80 over 40 ranks, not over 32
])  # fmt: skip
def test_a_global_batch_a_shrunk_world_cannot_divide_is_refused(nodes, floor, global_batch, shrunk, world) -> None:
    profile = shrinking(nodes, floor, global_batch)
    with pytest.raises(SynthError) as err:
        resolve(profile, outputs_of(profile), mode="ft_launcher+inprocess", run_id="r1")
    text = str(err.value)
    assert f"min_nodes {floor} lets training shrink to {shrunk} nodes" in text
    assert f"world size {world}" in text and "trainer.batch_size" in text and "\n" not in text


def test_min_nodes_above_node_count_is_a_profile_error() -> None:
    from config import ProfileError

    with pytest.raises(ProfileError, match="min_nodes 3 must be at most node_count 2"):
        profile_from_dict(load_profile("p5").model_dump(mode="json") | {"min_nodes": 3})


def test_the_image_command_names_the_profiles_nvrx(tmp_path: Path, outputs_file, capsys) -> None:
    from scripts.nvrx_eks import main

    path = tmp_path / "old.yaml"
    path.write_text((REPO / "config/profiles/p5.yaml").read_text() + "nvrx_version: 0.4.1\n")
    assert main(["image", "--profile", str(path), "--outputs", str(outputs_file()), "--nvrx_version"]) == 0
    assert capsys.readouterr().out.strip() == "0.4.1"


def test_the_refusal_through_the_cli_is_exit_2_and_one_line(tmp_path: Path, outputs_file) -> None:
    path = tmp_path / "spare.yaml"
    path.write_text((REPO / "config/profiles/p5.yaml").read_text() + "spare_nodes: 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "k8s", "synth", "--profile", str(path), "--mode", "baseline",
         "--outputs", str(outputs_file()), "--outdir", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "spare_nodes 1" in lines[0] and "baseline" in lines[0]
    assert not (tmp_path / "dist").exists()


def test_run_ids_leave_room_for_the_store_service() -> None:
    profile = spare_profile()
    # `train-<id>-store` is the longest name of a Job run: 6 + 51 + 6 = 63 fits, 52 does not.
    resolve(profile, outputs_of(profile), run_id="r" * 51)
    with pytest.raises(SynthError, match="store Service"):
        resolve(profile, outputs_of(profile), run_id="r" * 52)


def test_the_spare_is_a_node_rank_of_the_wrapper(tmp_path: Path, outputs_file) -> None:
    from scripts.nvrx_eks import main

    path = tmp_path / "spare.yaml"
    path.write_text((REPO / "config/profiles/p5.yaml").read_text() + "spare_nodes: 1\n")
    common = ["--profile", str(path), "--outputs", str(outputs_file()), "--dry_run", "--run_id", "r1"]
    assert main(["logs", *common, "--rank", "2"]) == 0
    assert main(["logs", *common, "--rank", "3"]) == 2
