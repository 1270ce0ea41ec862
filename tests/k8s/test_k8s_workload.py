"""Node loss, rendezvous, NCCL over EFA, the JobSet workload, and synthesis without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import kubernetes_validate
import pytest

from config import MODE_NAMES
from config import RecoveryMode, contract, load_profile
from k8s import synth
from k8s.deployment import resolve
from k8s.environment import OFI_NCCL_NET
from k8s.errors import SynthError
from k8s.outputs import load_outputs


REPO = Path(__file__).resolve().parents[2]
SCHEMA = "1.35.0"


def pod_specs(synthesis) -> list[dict]:
    specs = []
    for doc in synthesis.docs():
        if doc["kind"] == "Job":
            specs.append(doc["spec"]["template"]["spec"])
        elif doc["kind"] == "Pod":
            specs.append(doc["spec"])
    return specs


def test_every_gpu_pod_leaves_a_lost_node_within_seconds(synthesis) -> None:
    gpu = [s for s in pod_specs(synthesis) if s["nodeSelector"].get(contract.NODE_GROUP_LABEL_KEY) == "gpu"]
    assert gpu  # training, data prep, results; the export runs on the system nodes
    for spec in gpu:
        by_key = {t["key"]: t for t in spec["tolerations"]}
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            assert by_key[key] == {
                "key": key, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": contract.NODE_LOSS_TOLERATION_S,
            }  # fmt: skip
        assert by_key["nvidia.com/gpu"]["effect"] == "NoSchedule"
    assert contract.NODE_LOSS_TOLERATION_S <= 10  # after the node monitor's 40-50 s of silence


def test_efa_jobs_insist_on_the_ofi_plugin(synthesis) -> None:
    env = {name: e.get("value") for name, e in synthesis.env.items()}
    expected = OFI_NCCL_NET if synthesis.dep.has_efa else "Socket"
    assert env["NCCL_NET"] == expected


def test_dockerfile_checks_the_plugin_name_the_manifests_use() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert f'ARG OFI_NCCL_NET="{OFI_NCCL_NET}"' in text
    assert "libnccl-net-ofi.so" in text and "ncclNetPlugin_v" in text


def launch_command(synthesis, index: int) -> list[str]:
    """What trainer.recovery.launch would exec on node `index`, from the synthesized container args."""
    from trainer.recovery.launch import build_command, parse

    args = [a.replace("$(JOB_COMPLETION_INDEX)", str(index)) for a in synthesis.trainer["args"]]
    spec, trainer_args = parse(args)
    return build_command(spec, trainer_args)


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_rendezvous_outlasts_a_node_replacement_and_no_ft_node_hosts(synth_for, mode: str) -> None:
    """torchrun modes: node rank 0 hosts the stores. ft_launcher modes: the store pod does, and
    no launcher is the rendezvous host (`--external_store`)."""
    synthesis = synth_for("p5", mode)
    timeout = synthesis.dep.profile.recovery.rdzv_join_timeout_s
    assert timeout > 600  # NVRx's default is too short for a p5 replacement
    assert float(synthesis.args_value("--rdzv_join_timeout")) == timeout
    assert synthesis.args_value("--node_rank") == "$(JOB_COMPLETION_INDEX)"
    for index in (0, 1):
        cmd = launch_command(synthesis, index)
        assert f"--node-rank={index}" in cmd
        conf = next(a for a in cmd if a.startswith("--rdzv-conf="))
        if RecoveryMode(mode).uses_ft_launcher:
            assert f"join_timeout={timeout:g}" in conf and "is_host=true" not in conf
        else:
            assert conf == f"--rdzv-conf=timeout={timeout:g}"  # static: node rank 0 hosts


@pytest.fixture
def outputs_of(outputs_file):
    """The stack outputs of a profile, as `cdk deploy` would have written them."""
    return lambda profile: load_outputs(outputs_file(profile.name if profile.name in ("p5", "p4de", "g5-dev") else "p5"))


def jobset_synthesis(mode: str, outputs_of):
    profile = load_profile("p5").model_copy(update={"workload": "jobset"})
    dep = resolve(profile, outputs_of(profile), mode=mode, run_id="js-test")
    return dep, synth.build(dep)


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_jobset_workload_structure(mode: str, outputs_of) -> None:
    dep, manifests = jobset_synthesis(mode, outputs_of)
    train = manifests[synth.file_name(synth.TRAIN, dep.run_id)]
    kinds = sorted(d["kind"] for d in train)
    store = ["Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service"] if dep.external_store else []
    assert kinds == sorted(["ConfigMap", "JobSet", "NetworkPolicy", *store])  # the controller makes the Service
    (jobset,) = [d for d in train if d["kind"] == "JobSet"]
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert jobset["metadata"]["name"] == dep.job_name and jobset["metadata"]["namespace"] == dep.namespace
    spec = jobset["spec"]
    assert set(spec) == {"network", "failurePolicy", "successPolicy", "replicatedJobs"}
    assert spec["network"] == {"enableDNSHostnames": True, "subdomain": dep.service_name}
    (replicated,) = spec["replicatedJobs"]
    assert replicated["name"] == "node" and replicated["replicas"] == 1
    job_spec = replicated["template"]["spec"]
    assert job_spec["completions"] == job_spec["parallelism"] == dep.profile.node_count
    assert job_spec["completionMode"] == "Indexed"
    if dep.external_store:
        # a lost pod is replaced within the child Job; the store pod hosts the stores
        assert spec["failurePolicy"] == {"maxRestarts": dep.profile.recovery.backoff_limit}
        assert job_spec["backoffLimit"] == dep.profile.recovery.backoff_limit * dep.pod_count
        assert dep.master_addr == f"{dep.store_name}.{dep.namespace}.svc"
    else:
        assert spec["failurePolicy"] == {
            "maxRestarts": dep.profile.recovery.backoff_limit,
            "rules": [{"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}],
        }
        assert job_spec["backoffLimit"] == 0  # the first failure restarts the whole gang
        # Rank 0 is the first pod of the first child Job, in the JobSet's subdomain.
        assert dep.master_addr == f"{dep.job_name}-node-0-0.{dep.job_name}"
    container = job_spec["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--master_addr") + 1] == dep.master_addr
    # The child Job is a valid batch/v1 Job (the JobSet CRD's schema is not bundled).
    child = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "child"}, "spec": job_spec}
    kubernetes_validate.validate(child, SCHEMA, strict=True)
    for doc in (d for docs in manifests.values() for d in docs if d["kind"] != "JobSet"):
        kubernetes_validate.validate(doc, SCHEMA, strict=True)


def test_jobset_run_ids_leave_room_for_the_longer_hostnames(outputs_of) -> None:
    profile = load_profile("p5").model_copy(update={"workload": "jobset"})
    # 50 characters: `train-<id>-1` (58) and `train-<id>-store` (62) would fit a Job,
    # `train-<id>-node-0-1` (65) does not.
    resolve(profile.model_copy(update={"workload": "job"}), outputs_of(profile), run_id="r" * 50)
    with pytest.raises(SynthError, match="too long"):
        resolve(profile, outputs_of(profile), run_id="r" * 50)


@pytest.mark.parametrize(
    "trainer, recovery, message",
    [
        ({"barrier_timeout": 80.0}, {}, "timeouts must satisfy soft (60.0) < hard (90.0) < barrier (80.0)"),
        ({"fault_count": 2, "fault_types": ("exception", "meteor"), "fault_type_weights": (0.5, 0.5)}, {},
         "trainer.fault_types 'meteor' is unknown"),
        ({"fault_count": 2, "fault_type_weights": (1.0,)}, {}, "trainer.fault_type_weights has 1 values for 2 fault types"),
    ],
    ids=["barrier-below-hard", "unknown-fault", "mismatched-weights"],
)  # fmt: skip
def test_trainer_rejections_fail_at_synthesis(trainer, recovery, message, outputs_of) -> None:
    base = load_profile("p5")
    profile = base.model_copy(
        update={
            "trainer": base.trainer.model_copy(update=trainer),
            "recovery": base.recovery.model_copy(update=recovery),
        }
    )
    with pytest.raises(SynthError) as err:
        resolve(profile, outputs_of(profile), mode="baseline", run_id="r1")
    text = str(err.value)
    assert "the trainer rejects its flags" in text and message in text and "\n" not in text


def test_trainer_rejection_through_the_cli_is_exit_2(tmp_path: Path, outputs_file) -> None:
    text = (REPO / "config/profiles/p5.yaml").read_text() + "  fault_count: 3\n  fault_types: [exception, meteor]\n"
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("trainer:\n", "trainer:\n", 1))
    proc = subprocess.run(
        [sys.executable, "-m", "k8s", "synth", "--profile", str(path), "--outputs", str(outputs_file()),
         "--outdir", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "trainer.fault_types 'meteor' is unknown" in lines[0]
    assert not (tmp_path / "dist").exists()


def test_manifests_synthesize_without_torch(tmp_path: Path, outputs_file) -> None:
    """An install without the trainer extra synthesizes, plans and submits: k8s never imports torch."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        from k8s.cli import main
        from config import MODE_NAMES
        for mode in MODE_NAMES:
            assert main(["synth", "--profile", "p5", "--mode", mode, "--outputs", {str(outputs_file())!r},
                         "--outdir", {str(tmp_path / "dist")!r}]) == 0
        from scripts.nvrx_eks import main as wrapper
        assert wrapper(["plan", "--profile", "p5"]) == 0
        assert wrapper(["submit", "--profile", "p5", "--outputs", {str(outputs_file())!r}, "--dry_run"]) == 0
        assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None and m.split(".")[0] == "torch"]
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list((tmp_path / "dist").glob("30-train-*.yaml"))) == len(MODE_NAMES)


def test_mode_table_is_the_trainers() -> None:
    from trainer.config import MODE_NAMES as TRAINER_MODES
    from trainer.config import TrainConfig

    assert tuple(TRAINER_MODES) == tuple(m.value for m in RecoveryMode)
    for mode in RecoveryMode:
        cfg = TrainConfig(mode=mode.value)
        assert cfg.inprocess is mode.in_process
        assert cfg.ft_launcher is mode.uses_ft_launcher is mode.heartbeats
        assert mode.job_restart
    assert RecoveryMode.FT_LAUNCHER_INPROCESS.slug == "ft-launcher-inprocess"
