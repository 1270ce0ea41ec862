"""Bad flags: one line on stderr, exit code 2, before any process group or file exists."""

import importlib.util
import subprocess
import sys

import pytest

from tests.jobs import ROOT


@pytest.mark.parametrize("args, fragment", [
    (["--max_steps", "0"], "--max_steps 0 must be at least 1"),
    (["--use_async_checkpoint", "maybe"], "'maybe' is not a boolean"),
    (["--fault_types", "exception,boom", "--checkpoint_dir", "x"], "'boom' is unknown"),
    (["--fault_type_weights", "0.5", "--fault_types", "exception,hang"], "has 1 values for 2"),
    (["--tiers", "disk", "--snapshot_interval", "1", "--checkpoint_dir", "x"], "'disk' is unknown"),
    (["--snapshot_staging", "device"], "--snapshot_staging device needs snapshot --tiers"),
    (["--snapshot_staging", "gpu"], "invalid choice: 'gpu'"),
    (["--compute_dtype", "fp16"], "invalid choice: 'fp16'"),
    (["--checkpoint_interval", "5"], "needs --checkpoint_dir"),
    (["--resume", "required", "--checkpoint_dir", "/nonexistent/ckpt"], "holds no complete checkpoint"),
    (["--model", "gpt-5"], "neither a preset"),
    (["--mode", "inprocess", "--nccl_timeout", "100", "--hard_timeout", "90"], "must be below --hard_timeout"),
    (["--soft_timeout", "100", "--hard_timeout", "90"], "soft (100.0) < hard (90.0)"),
    pytest.param(["--wandb_project", "demo"],
                 "--wandb_project 'demo' needs the wandb package, which is not installed",
                 marks=pytest.mark.skipif(importlib.util.find_spec("wandb") is not None,
                                          reason="wandb is installed here")),
])
def test_bad_flag_is_one_line_and_exit_2(tmp_path, args, fragment):
    proc = subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0]
    assert not list(tmp_path.iterdir())


def test_local_runner_rejects_bad_trainer_flags_before_launching(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "devtools.local", "--run_dir", str(run_dir), "--",
                           "--batch_size", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--batch_size 0 must be at least 1" in proc.stderr
    assert not run_dir.exists()


@pytest.mark.parametrize("argv, fragment", [
    (["python -m trainer.recovery.launch", "--metrics_port", "70000"],
     "--metrics_port 70000 must be a port number, 0 to 65535 (0: off)"),
    (["python -m devtools.local", "--metrics_port", "65535", "--nnodes", "2"],
     "--metrics_port 65535 leaves no port for each of 2 node(s)"),
])
def test_a_bad_metrics_port_is_one_line_and_exit_2(tmp_path, argv, fragment):
    prog, *flags = argv
    module = prog.split()[-1]
    common = ["--mode", "baseline"] + (["--nnodes", "1", "--nproc_per_node", "1", "--node_rank",
                                        "0", "--master_addr", "127.0.0.1"]
                                       if module.startswith("trainer") else
                                       ["--run_dir", str(tmp_path / "run")])
    proc = subprocess.run([sys.executable, "-m", module, *common, *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert fragment in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()


def test_launcher_command_per_mode():
    from trainer.recovery.launch import LaunchSpec, build_command

    spec = LaunchSpec("ft_launcher+inprocess", 4, 8, 2, "job-0.svc", 29500, 7, 300, 1200, 5)
    cmd = build_command(spec, ["--max_steps", "10"])
    joined = " ".join(cmd)
    assert cmd[1:3] == ["-m", "trainer.recovery.forkserver"]  # ft_launcher, workers forked
    assert "--max-restarts=7" in cmd and "--ft-rank-heartbeat-timeout=300" in cmd
    assert "--ft-initial-rank-heartbeat-timeout=1200" in cmd
    assert "--rdzv-endpoint=job-0.svc:29500" in cmd and "--nnodes=4" in cmd
    assert "--ft-workload-check-interval=5" in cmd
    script = cmd.index("--start-method=forkserver") + 1
    assert cmd[script] == str(ROOT / "trainer" / "__main__.py")
    assert cmd[script + 1:] == ["--mode", "ft_launcher+inprocess", "--max_steps", "10"]
    base = build_command(LaunchSpec("baseline", 2, 8, 1, "job-0.svc", 29500), [])
    assert base[1:3] == ["-m", "trainer.recovery.torchrun"]  # torchrun, named to its workers
    assert "--max-restarts=0" in base and "--node-rank=1" in base


# What each mode does, written out: the launcher, local runner, demo and benchmarks derive it
# from the mode table's traits, never from the mode's name.
PER_MODE = {  # mode: (job restarts by default, launcher restart budget, heartbeat timeout by
    # default with a hard timeout of 100 s, a heartbeat timeout of 50 s refused)
    "baseline": (10, False, 30.0, False),
    "ft_launcher": (0, True, 30.0, False),
    "inprocess": (0, False, 30.0, False),
    "ft_launcher+inprocess": (0, True, 130.0, True),
}


@pytest.mark.parametrize("mode", sorted(PER_MODE))
def test_per_mode_settings_follow_the_mode_table(mode):
    from config.contract import RecoveryMode
    from devtools.local import parse
    from trainer.recovery.launch import default_heartbeat_timeout

    job_restarts, launcher_restarts, heartbeat, _ = PER_MODE[mode]
    args, _ = parse(["--mode", mode])
    assert args.job_restarts == job_restarts
    assert RecoveryMode(mode).launcher_restarts_workers is launcher_restarts
    assert default_heartbeat_timeout(mode, hard_timeout=100.0) == heartbeat


def test_heartbeat_timeout_below_the_hard_timeout_is_refused_only_with_both_layers(capsys):
    from trainer.config import parse_args
    from trainer.recovery.launch import LaunchSpec, check

    for mode, (*_, refused) in PER_MODE.items():
        cfg = parse_args(["--mode", mode, "--device", "cpu", "--hard_timeout", "100"])
        spec = LaunchSpec(mode, 1, 2, 0, "127.0.0.1", heartbeat_timeout=50)
        if refused:
            with pytest.raises(SystemExit) as exc:
                check(spec, cfg)
            assert exc.value.code == 2
            assert "--heartbeat_timeout 50 must exceed the trainer's --hard_timeout 100" in \
                capsys.readouterr().err
        else:
            check(spec, cfg)


def test_launcher_defaults_are_written_once():
    from config.contract import DEFAULT_MASTER_PORT
    from trainer.recovery.launch import LaunchSpec, parse

    spec, _ = parse(["--mode", "baseline", "--nnodes", "1", "--nproc_per_node", "2",
                     "--node_rank", "0", "--master_addr", "127.0.0.1"])
    assert spec == LaunchSpec("baseline", 1, 2, 0, "127.0.0.1")
    assert spec.master_port == DEFAULT_MASTER_PORT


def test_help_shows_every_setting_with_its_default():
    from config.training import TrainConfig
    from config.training import shown as spelled

    proc = subprocess.run([sys.executable, "-m", "trainer", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())  # argparse wraps help lines
    for name, info in TrainConfig.model_fields.items():
        assert f"--{name}" in text, name
        assert f"(default: {spelled(info.default)})" in text.split(f"--{name}", 2)[-1], name
    assert "llama-3b" in text


def test_the_settings_reference_in_the_docs_is_current(tmp_path):
    from config.reference import write_reference

    doc = tmp_path / "configuration.md"
    doc.write_text((ROOT / "docs" / "configuration.md").read_text())
    assert not write_reference(str(doc)), "run `python -m config.reference docs/configuration.md`"


def test_a_model_path_is_checked_on_the_machine_that_trains(tmp_path):
    """A path is accepted by the settings' own rules (the synth cannot see FSx), and refused
    before launch on a machine where it is not a model directory."""
    from trainer.config import from_values

    assert from_values(model="/fsx/models/llama").model == "/fsx/models/llama"
    proc = subprocess.run([sys.executable, "-m", "trainer", "--model", str(tmp_path / "none")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"python -m trainer: error: --model '{tmp_path / 'none'}' is not a directory on this machine"]
