"""The manifests' command lines are accepted by the trainer's own parsers (the contract, executed).

Only argument parsing runs: no torch, no process group. A flag renamed on either side, or a
profile value the trainer rejects (it exits 2, which fails the Job at once), fails here first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s import commands, naming


def test_launcher_and_trainer_accept_the_job_args(synthesis) -> None:
    from trainer.config import parse_args
    from trainer.recovery.launch import parse

    dep = synthesis.dep
    last_rank = str(dep.profile.node_count - 1)
    args = [a.replace(f"$({naming.COMPLETION_INDEX_ENV})", last_rank) for a in synthesis.trainer["args"]]
    spec, trainer_args = parse(args)
    assert (spec.mode, spec.node_rank, spec.master_addr) == (dep.mode, int(last_rank), dep.master_addr)
    assert (spec.nnodes, spec.nproc_per_node) == (dep.profile.node_count, dep.instance.gpus)
    assert spec.max_restarts == commands.restarts_for(dep)
    cfg = parse_args([*trainer_args, "--mode", spec.mode], environment=False)  # FSx is not here
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
    cfg = parse_args([*trainer_args, "--mode", spec.mode], environment=False)
    assert contract.inprocess_ports(launch_env(spec, cfg, base={})) == \
        (naming.INPROCESS_WRAPPER_PORT, naming.INPROCESS_APP_PORT)
    # a rank started without our launcher follows MASTER_PORT
    assert contract.inprocess_ports({"MASTER_PORT": str(port)}) == \
        (naming.INPROCESS_WRAPPER_PORT, naming.INPROCESS_APP_PORT)


def test_data_prep_args_are_accepted(synth_for, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.loop.data

    seen = {}

    def fake_prepare(source: str, num_samples: int, tokenizer: str, output: Path):
        seen.update(source=source, num_samples=num_samples, tokenizer=tokenizer, output=str(output))
        raise ValueError("stop before any download")

    monkeypatch.setattr(trainer.loop.data, "prepare", fake_prepare)
    synthesis = synth_for("p5", "baseline")
    container = synthesis.one("Job", "data-prep")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "trainer.loop.data"]
    assert trainer.loop.data.main(container["args"]) == 2  # the fake's error, after parsing succeeded
    assert seen == {
        "source": "c4",
        "num_samples": synthesis.dep.profile.data.samples,
        "tokenizer": "meta-llama/Llama-3.1-8B",  # the model's own
        "output": synthesis.dep.data_dir,
    }
