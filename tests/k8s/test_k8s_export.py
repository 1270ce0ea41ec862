"""The export Job: on the system nodes, unprivileged, FSx read-only but for the run's export
directory, memory for what an export holds at once, and arguments the export tool accepts.
`test_k8s_validate` validates it strictly with every other manifest."""

from __future__ import annotations

import pytest

from config import load_profile
from config.presets import preset_largest_parameter
from k8s import synth
from k8s.charts.export import OVERHEAD_BYTES, held_bytes
from k8s.deployment import ExportRequest, resolve
from k8s.errors import SynthError
from tests.k8s.conftest import outputs_of


def export_job(profile: str = "p5", **request) -> tuple[object, dict]:
    prof = load_profile(profile)
    dep = resolve(prof, outputs_of(prof), run_id="r1", export=ExportRequest(**request))
    docs = synth.build(dep, [synth.EXPORT])["50-export-r1.yaml"]
    (job,) = [d for d in docs if d["kind"] == "Job"]  # beside it, its NetworkPolicy
    return dep, job


def test_runs_unprivileged_on_the_system_nodes(synthesis) -> None:
    job = synthesis.one("Job", "export")
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvrx-eks/node-group": "system"}
    assert "tolerations" not in spec  # never on a GPU node
    (container,) = spec["containers"]
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["runAsUser"] == 10001
    assert "add" not in container["securityContext"]["capabilities"]
    assert "limits" in container["resources"] and "nvidia.com/gpu" not in container["resources"]["limits"]
    assert job["spec"]["podFailurePolicy"]["rules"][1]["onExitCodes"] == {
        "containerName": "export", "operator": "In", "values": [2]}  # a damaged checkpoint: no retry


def test_fsx_is_read_only_but_for_the_runs_export_directory(synthesis) -> None:
    spec = synthesis.one("Job", "export")["spec"]["template"]["spec"]
    run_dir = synthesis.dep.run_dir
    mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "fsx"]
    assert mounts == [
        {"mountPath": "/fsx", "name": "fsx", "readOnly": True},
        {"mountPath": f"{run_dir}/export", "name": "fsx", "subPath": f"runs/{synthesis.dep.run_id}/export"},
    ]
    assert f"mkdir -p {run_dir}/export" in spec["initContainers"][0]["command"][-1]


def test_arguments_are_the_export_tools(tmp_path) -> None:
    from trainer.export.cli import build_parser

    dep, job = export_job(format="dcp", step=40, dtype="bf16", optimizer=True)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "trainer.export"]
    args = build_parser().parse_args(container["args"])
    assert (args.format, args.step, args.dtype, args.optimizer) == ("dcp", 40, "bf16", True)
    assert str(args.checkpoint_dir) == dep.checkpoint_dir == "/fsx/runs/r1/checkpoints"
    assert str(args.out_root) == "/fsx/runs/r1/export" and args.out is None
    assert job["metadata"]["name"] == "export-dcp-r1"


def test_memory_covers_one_file_or_the_largest_parameter() -> None:
    """llama3.1-8b (p5): its embedding (2.1 GB in fp32) outgrows a 2 GB file; in bf16 a file is
    the most held; dcp holds one tensor."""
    embedding = preset_largest_parameter("llama3.1-8b")
    for request, held in (({"format": "hf"}, embedding * 4), ({"format": "hf", "dtype": "bf16"}, 2 * 10**9),
                          ({"format": "dcp"}, embedding * 4)):
        dep, job = export_job(**request)
        assert held_bytes(dep) == held
        memory = job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
        assert int(memory.removesuffix("Gi")) * (1 << 30) >= held + OVERHEAD_BYTES


def test_a_bad_request_is_one_line() -> None:
    for request, message in (({"format": "gguf"}, "export format 'gguf' is not one of hf, dcp"),
                             ({"dtype": "fp8"}, "export dtype 'fp8' is not one of fp32, bf16"),
                             ({"format": "hf", "optimizer": True}, "--optimizer applies to --format dcp")):
        with pytest.raises(SynthError, match=message):
            export_job(**request)
