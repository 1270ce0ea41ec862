"""The manifests' command lines are accepted by the trainer's own parsers (the contract, executed).

Only argument parsing runs: no torch, no process group. A flag renamed on either side, or a
profile value the trainer rejects (it exits 2, which fails the Job at once), fails here first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from config import load_profile
from config.profile import DataSettings
from k8s import commands, naming, synth
from k8s.deployment import resolve
from k8s.outputs import load_outputs


def test_launcher_and_trainer_accept_the_job_args(synthesis) -> None:
    from trainer.config import parse_args
    from trainer.recovery.launch import parse

    dep = synthesis.dep
    last_rank = str(dep.pod_count - 1)
    args = [a.replace(f"$({naming.COMPLETION_INDEX_ENV})", last_rank) for a in synthesis.trainer["args"]]
    spec, trainer_args = parse(args)
    assert (spec.mode, spec.node_rank, spec.master_addr) == (dep.mode, int(last_rank), dep.master_addr)
    assert (spec.nnodes, spec.nproc_per_node) == (dep.profile.node_count, dep.instance.gpus)
    if dep.external_store:  # the node range and the store pod (`--external_store`)
        assert (spec.min_nodes, spec.spare_nodes) == (dep.profile.shrink_floor, dep.profile.spare_nodes)
        assert spec.external_store is True
    assert spec.max_restarts == commands.restarts_for(dep)
    cfg = parse_args([*trainer_args, "--mode", spec.mode])  # FSx is not here
    assert cfg.checkpoint_dir == dep.checkpoint_dir
    assert cfg.results_path == dep.results_path
    assert cfg == dep.train and cfg.device == "cuda"


def test_the_pods_open_the_ports_the_launcher_and_its_ranks_use(synthesis) -> None:
    """P the rendezvous store, P+1 the Wrapper's store, P+2 the application store (the
    contract's rule); the Service and container ports are those and the launcher's metrics
    port, which it is given; the rank finds its Wrapper store where the pods open it."""
    from config import contract
    from trainer.config import parse_args
    from trainer.recovery.launch import launch_env, parse

    port = int(synthesis.args_value("--master_port"))
    assert port == naming.RENDEZVOUS_PORT
    assert naming.INPROCESS_WRAPPER_PORT == contract.wrapper_store_port(port)
    assert naming.INPROCESS_APP_PORT == contract.app_store_port(port)
    opened = {p["containerPort"] for p in synthesis.trainer["ports"]}
    assert opened == {*range(port, port + contract.PORTS_PER_JOB), contract.METRICS_PORT}
    spec, trainer_args = parse([a.replace(f"$({naming.COMPLETION_INDEX_ENV})", "0")
                                for a in synthesis.trainer["args"]])
    assert spec.metrics_port == contract.METRICS_PORT
    cfg = parse_args([*trainer_args, "--mode", spec.mode])
    assert contract.inprocess_ports(launch_env(spec, cfg, base={})) == \
        (naming.INPROCESS_WRAPPER_PORT, naming.INPROCESS_APP_PORT)
    # a rank started without our launcher follows MASTER_PORT
    assert contract.inprocess_ports({"MASTER_PORT": str(port)}) == \
        (naming.INPROCESS_WRAPPER_PORT, naming.INPROCESS_APP_PORT)


def _data_prep_seen(manifests: dict[str, list[dict]], monkeypatch: pytest.MonkeyPatch) -> dict:
    """What the data-prep container's arguments hand to `prepare`, through the real parser."""
    import trainer.loop.data

    seen = {}

    def fake_prepare(source: str, num_samples: int, tokenizer: str, output: Path, *,
                     text_field: str, num_proc: int, progress) -> None:
        seen.update(source=source, num_samples=num_samples, tokenizer=tokenizer, output=str(output),
                    text_field=text_field, num_proc=num_proc)
        raise ValueError("stop before any download")

    monkeypatch.setattr(trainer.loop.data, "prepare", fake_prepare)
    [job] = [d for docs in manifests.values() for d in docs if d["kind"] == "Job"
             and d["metadata"]["labels"]["app.kubernetes.io/component"] == "data-prep"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "trainer.loop.data"]
    assert trainer.loop.data.main(container["args"]) == 2  # the fake's error, after parsing succeeded
    # one tokenizing process per CPU of the pod
    resources = container["resources"]
    assert seen.pop("num_proc") == int(resources["requests"]["cpu"]) == int(resources["limits"]["cpu"])
    # bad input (exit 2) fails the Job at once; other failures get the Job's retries, and a
    # disruption (a drained node) replaces the pod without counting
    ignore, rule = job["spec"]["podFailurePolicy"]["rules"]
    assert ignore["action"] == "Ignore"
    assert rule["action"] == "FailJob" and rule["onExitCodes"] == {
        "containerName": container["name"], "operator": "In", "values": [2]}
    return seen


def test_data_prep_args_are_accepted(synth_for, monkeypatch: pytest.MonkeyPatch) -> None:
    synthesis = synth_for("p5", "baseline")
    assert _data_prep_seen(synthesis.manifests, monkeypatch) == {
        "source": "c4",
        "num_samples": synthesis.dep.profile.data.samples,
        "tokenizer": "meta-llama/Llama-3.1-8B",  # the model's own
        "output": synthesis.dep.data_dir,
        "text_field": "text",
    }


def test_the_profiles_data_section_reaches_data_prep(outputs_file, monkeypatch: pytest.MonkeyPatch) -> None:
    data = DataSettings(source="hf:HuggingFaceFW/fineweb-edu:sample-10BT", samples=5000,
                        text_field="content", tokenizer="byte")
    profile = load_profile("p5").model_copy(update={"data": data})
    dep = resolve(profile, load_outputs(outputs_file("p5")), mode="baseline", run_id="r1")
    assert _data_prep_seen(synth.build(dep), monkeypatch) == {
        "source": data.source, "num_samples": 5000, "tokenizer": "byte",
        "output": dep.data_dir, "text_field": "content",
    }
    # another field is other data: its own directory
    assert dep.data_dir == "/fsx/data/hf-huggingfacefw-fineweb-edu-sample-10bt.byte.5000.content"


def test_the_store_pods_command_is_the_store_servers(synth_for) -> None:
    """The store pod runs what the store server parses, and opens exactly the ports it serves."""
    from trainer.recovery.store_server import parse, store_ports

    synthesis = synth_for("p5", "ft_launcher+inprocess")
    deployment = synthesis.one("Deployment", naming.COMPONENT_STORE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "trainer.recovery.store_server"]
    args = parse(container["args"])
    assert args.master_port == int(synthesis.args_value("--master_port"))
    # the rendezvous whose rounds it closes is the launchers'
    launcher = [synthesis.args_value(f) for f in ("--nnodes", "--min_nodes", "--spare_nodes",
                                                  "--rdzv_join_timeout")]
    assert (args.nnodes, args.min_nodes, args.spare_nodes, args.rdzv_join_timeout) == \
        (int(launcher[0]), int(launcher[1]), int(launcher[2]), float(launcher[3]))
    assert [p["containerPort"] for p in container["ports"]] == store_ports(args.master_port)
    service = synthesis.one("Service", naming.COMPONENT_STORE)
    assert [p["port"] for p in service["spec"]["ports"]] == store_ports(args.master_port)
