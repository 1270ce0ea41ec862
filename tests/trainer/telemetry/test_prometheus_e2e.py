"""Prometheus metrics of a real run: each node's /metrics, scraped by a real Prometheus server
(Debian's package, unpacked by `make test`), the step growing between two scrapes; and the
endpoint itself, read with prometheus-client's own parser."""

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.local import free_port_block
from tests.jobs import JOB_FLAGS, ROOT, env_for, kill_group, start_local, wait_for
from trainer.telemetry.exporter import serve
from trainer.telemetry.published import publish

pytestmark = pytest.mark.slow  # servers and a real run

UNPACKED = ROOT / ".cache" / "prometheus" / "bin" / "prometheus"  # `make test` puts it there
PROMETHEUS = str(UNPACKED) if UNPACKED.exists() else shutil.which("prometheus")


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name.startswith("nvrx_eks_")}


def test_the_endpoint_serves_what_the_workers_published_at_each_scrape(tmp_path):
    figures = tmp_path / "figures.json"
    server = serve(0, figures, addr="127.0.0.1")
    port = server.server_port
    try:
        assert _scrape(port) == {}  # nothing published yet: no figure, the endpoint up
        now = time.time()
        publish(figures, {"published_at": now - 3, "step": 40, "max_steps": 100,
                          "tokens_per_second": 1234.5, "mfu_pct": None})
        node = _scrape(port)  # another node than rank 0's: its own figures only
        assert node["nvrx_eks_step"] == 40 and node["nvrx_eks_tokens_per_second"] == 1234.5
        assert node["nvrx_eks_figures_age_seconds"] >= 3
        assert "nvrx_eks_mfu_ratio" not in node and "nvrx_eks_restarts" not in node
        publish(figures, {"published_at": now, "step": 41, "max_steps": 100,
                          "tokens_per_second": 1000.0, "mfu_pct": 42.0, "restarts": 2,
                          "last_recovery_seconds": 1.5, "checkpoint_step": 40,
                          "checkpoint_committed_at": now - 10, "training_goodput_pct": 80.0,
                          "infra_goodput_pct": 90.0})
        rank0 = _scrape(port)
        assert rank0["nvrx_eks_step"] == 41 and rank0["nvrx_eks_mfu_ratio"] == pytest.approx(0.42)
        assert rank0["nvrx_eks_restarts"] == 2 and rank0["nvrx_eks_last_recovery_seconds"] == 1.5
        assert rank0["nvrx_eks_checkpoint_step"] == 40
        assert rank0["nvrx_eks_checkpoint_age_seconds"] >= 10
        assert rank0["nvrx_eks_training_goodput_ratio"] == pytest.approx(0.8)
        assert rank0["nvrx_eks_infra_goodput_ratio"] == pytest.approx(0.9)
    finally:
        server.shutdown()


def test_the_pods_launcher_serves_its_workers_figures(cache_dir, tmp_path):
    """The pods' entry point (`python -m trainer.recovery.launch`, as the manifests run it)
    serves /metrics on --metrics_port from its workers' figures, read here with
    prometheus-client's own parser."""
    metrics, master = free_port_block(1), free_port_block()
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "trainer.recovery.launch", "--mode", "baseline", "--nnodes", "1",
           "--nproc_per_node", "2", "--node_rank", "0", "--master_addr", "127.0.0.1",
           "--master_port", str(master), "--metrics_port", str(metrics), "--", *JOB_FLAGS,
           "--max_steps", "100000", "--log_interval", "1", "--checkpoint_dir",
           str(run_dir / "checkpoints"), "--results_path", str(run_dir / "results.json")]
    run_dir.mkdir()
    launcher = subprocess.Popen(cmd, cwd=ROOT, env=env_for(cache_dir), start_new_session=True,
                                stdout=open(run_dir / "launcher.log", "w"), stderr=subprocess.STDOUT)
    try:
        def scraped() -> dict[str, float]:
            try:
                return _scrape(metrics)
            except OSError:  # not listening yet
                return {}

        # The run's figures follow the step figures by the live pass's few seconds.
        wait_for(lambda: "nvrx_eks_infra_goodput_ratio" in scraped(), timeout=240,
                 what="the launcher's /metrics with the run's figures")
        first = scraped()
        assert first["nvrx_eks_max_steps"] == 100000 and first["nvrx_eks_tokens_per_second"] > 0
        assert first["nvrx_eks_restarts"] == 0 and first["nvrx_eks_step"] >= 1
        wait_for(lambda: scraped()["nvrx_eks_step"] > first["nvrx_eks_step"], timeout=240,
                 what="a later step")
    finally:
        kill_group(launcher)


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())["data"]["result"]
    except OSError:  # the server is still starting
        return []


def test_a_real_prometheus_scrapes_every_node_of_a_run_and_sees_its_step_grow(cache_dir, tmp_path):
    if PROMETHEUS is None:
        pytest.fail("prometheus is not installed: run `make .cache/prometheus/bin/prometheus` "
                    "(Debian's package, unpacked; `make test` does it)")
    metrics, prom_port = free_port_block(2), free_port_block(1)
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "nvrx-eks", "metrics_path": "/metrics",
                            "static_configs": [{"targets": [f"127.0.0.1:{metrics}",
                                                            f"127.0.0.1:{metrics + 1}"]}]}]}))
    server = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                               f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=open(tmp_path / "prometheus.log", "w"),
                              stderr=subprocess.STDOUT)
    run = start_local(cache_dir, "baseline", tmp_path / "run", "--max_steps", "100000",
                      "--log_interval", "1", "--checkpoint_interval", "20", nproc=1,
                      local_args=("--nnodes", "2", "--metrics_port", str(metrics)))
    try:
        def steps() -> dict[str, tuple[float, float]]:
            """instance -> (scrape time, step) of the newest sample Prometheus holds"""
            return {r["metric"]["instance"]: (float(r["value"][0]), float(r["value"][1]))
                    for r in _query(prom_port, "nvrx_eks_step")}

        wait_for(lambda: len(steps()) == 2 and min(v for _, v in steps().values()) >= 1,
                 timeout=240, what="both nodes' step in Prometheus")
        node0 = f"127.0.0.1:{metrics}"
        t1, first = steps()[node0]
        wait_for(lambda: steps()[node0][1] > first, timeout=240, what="a later, higher step")
        t2, later = steps()[node0]
        assert t2 > t1 and later > first
        up = {r["metric"]["instance"]: r["value"][1] for r in _query(prom_port, "up")}
        assert up == {node0: "1", f"127.0.0.1:{metrics + 1}": "1"}
        # The run's figures come from rank 0's node only; every node serves its step.
        wait_for(lambda: _query(prom_port, "nvrx_eks_checkpoint_step"), timeout=240,
                 what="a committed checkpoint in Prometheus")
        for name in ("nvrx_eks_infra_goodput_ratio", "nvrx_eks_restarts",
                     "nvrx_eks_checkpoint_age_seconds"):
            assert [r["metric"]["instance"] for r in _query(prom_port, name)] == [node0], name
        assert float(_query(prom_port, "nvrx_eks_restarts")[0]["value"][1]) == 0
    finally:
        kill_group(run)
        server.terminate()
        server.wait(timeout=60)
