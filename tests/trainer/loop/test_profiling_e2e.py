"""The profiler window: a trace per rank and a summary of where the steps' time went, with the
collectives told apart from compute. Real job, CPU ranks."""

import json

import pytest

from tests.jobs import ok, results, run_local

from trainer.loop.profiling import category, host_wait


@pytest.mark.parametrize("first,count", [(3, 2), (1, 1)], ids=["steady", "first-step"])
def test_profile_window_writes_traces_and_a_summary(cache_dir, tmp_path, first, count):
    """Also for an attempt's first step, which is bounded like a phase."""
    run_dir = tmp_path / "run"
    proc = run_local(cache_dir, "baseline", run_dir, "--max_steps", "6", "--profile_from",
                     str(first), "--profile_steps", str(count))
    ok(proc)
    assert results(run_dir)["steps_completed"] == 6
    profile = run_dir / "profile"
    for rank in (0, 1):
        trace = json.loads((profile / f"rank{rank:05d}.trace.json").read_text())
        assert trace["traceEvents"]
    summary = json.loads((profile / "summary.json").read_text())
    assert summary["steps"] == count and summary["time"] == "cpu"
    by_category = summary["ms_per_step_by_category"]
    assert by_category["compute"] > 0 and by_category["collectives"] > 0
    assert any(op["op"].startswith("aten::mm") for op in summary["top_ops_ms_per_step"])
    assert isinstance(summary["host_wait_ms_per_step"], dict)
    assert f"profile of {count} steps" in proc.stdout


def test_operator_names_map_to_categories():
    assert category("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "collectives"
    assert category("c10d::_allgather_base_") == "collectives"
    assert category("Memcpy DtoH (Device -> Pinned)") == "copy device to host"
    assert category("Memcpy PtoP (Device -> Device)") == "copy peer to peer"
    assert category("sm90_xmma_gemm_bf16bf16_bf16f32") == "compute"


def test_host_calls_that_wait_for_the_device_are_told_apart():
    assert host_wait("cudaStreamSynchronize") and host_wait("cudaEventSynchronize")
    assert host_wait("aten::_local_scalar_dense") and host_wait("cudaMemcpy")
    assert not host_wait("cudaMemcpyAsync") and not host_wait("cudaEventQuery")
    assert not host_wait("aten::mm")
