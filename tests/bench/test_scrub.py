"""Result files carry no absolute path of the machine that wrote them (bench.scrub)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import scrub

REPO = Path(__file__).resolve().parents[2]
MACHINE_PATH = re.compile(r"/(work|root|opt|tmp|home)/")


def test_scrub_rewrites_the_paths_of_a_sample(tmp_path):
    root = Path("/work/checkout")
    sample = {
        "machine": {"torch": "2.11.0", "bandwidth": "55.3 GB/s"},
        "command": ["/opt/torch/.venv/bin/python3", "-m", "devtools.local", "--run_dir",
                    "/tmp/nl07d/runs/spare-kill", "--node_dir", "/mnt/hugeshm"],
        "results": {"run": {
            "command": "-m devtools.local --run_dir /work/checkout/runs/bench/x -- --node_dir /dev/shm",
            "config": {"checkpoint_dir": "/work/main/runs/bench/x/checkpoints",
                       "results_path": "/tmp/ref07/results.json",
                       "other": "/home/someone/notes.txt", "relative": "runs/x",
                       "interpreter": "/work/wt/other/.venv/bin/python"}}},
    }
    clean = scrub.scrub(sample, root)
    assert clean["command"] == ["python", "-m", "devtools.local", "--run_dir",
                                "<tmp>/runs/spare-kill", "--node_dir", "/mnt/hugeshm"]
    run = clean["results"]["run"]
    assert run["command"] == "-m devtools.local --run_dir runs/bench/x -- --node_dir /dev/shm"
    assert run["config"] == {"checkpoint_dir": "runs/bench/x/checkpoints",
                             "results_path": "<tmp>/results.json",
                             "other": "<elsewhere>/notes.txt", "relative": "runs/x",
                             "interpreter": "python"}
    assert clean["machine"] == sample["machine"]
    assert scrub.scrub(clean, root) == clean  # idempotent

    f = tmp_path / "r.json"
    f.write_text(json.dumps(sample, indent=1) + "\n")
    assert scrub.scrub_file(f, root) is True
    assert json.loads(f.read_text()) == clean and f.read_text().endswith("}\n")
    assert scrub.scrub_file(f, root) is False


def test_no_result_file_holds_a_machine_path():
    files = sorted((REPO / "bench" / "results").rglob("*.json"))
    assert files
    dirty = [str(f.relative_to(REPO)) for f in files if MACHINE_PATH.search(f.read_text())]
    assert dirty == [], "run `python -m bench.scrub` on them"
