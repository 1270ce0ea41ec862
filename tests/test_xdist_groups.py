"""The suite's `xdist_group` marks hold under `make test`'s flags: a module whose tests share one
job (a module-scoped fixture: `test_spares_e2e`, `test_export`) runs on one worker, so the job
runs once. pytest 9.2 with xdist 3.8 drops the groups silently (pytest-dev/pytest-xdist#1386):
each worker then ran its own copy of the job."""

import os
import subprocess
import sys
import textwrap

GROUPED = textwrap.dedent("""
    import os

    import pytest

    pytestmark = pytest.mark.xdist_group("shared_job")


    @pytest.mark.parametrize("i", range(6))
    def test_records_its_worker(i):
        with open(os.environ["WORKERS_OUT"], "a") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
""")


def _outside_pytest() -> dict:
    """This environment without this run's own pytest variables (its worker's name)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_the_tests_of_a_group_run_on_one_worker(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the nested run's root
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    out = tmp_path / "workers.txt"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env={**_outside_pytest(), "WORKERS_OUT": str(out)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = out.read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
