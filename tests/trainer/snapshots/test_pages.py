"""The node directory's page size (`trainer.node_dir.page_bytes`), read off real mounts: a tmpfs
mounted in a private mount namespace with and without huge pages, as the GPU nodes' /dev/shm
and a host's default /dev/shm are."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs import ROOT
from trainer.node_dir import HUGE_PAGE, SHMEM_ENABLED, page_bytes

SMALL = os.sysconf("SC_PAGE_SIZE")


def host_setting() -> str:
    try:
        text = SHMEM_ENABLED.read_text()
        return text[text.index("[") + 1:text.index("]")]
    except (OSError, ValueError):
        return ""


@pytest.mark.parametrize("huge, expected", [("always", HUGE_PAGE), ("within_size", HUGE_PAGE),
                                            ("never", SMALL)])
def test_a_tmpfs_reports_the_pages_it_was_mounted_with(tmp_path, huge, expected):
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare (Linux) for a private mount namespace")
    if host_setting() in ("force", "deny"):  # the host decides for every tmpfs
        expected = HUGE_PAGE if host_setting() == "force" else SMALL
    point = tmp_path / "node dir"  # a space: /proc/mounts escapes it
    point.mkdir()
    code = "import sys; from pathlib import Path; from trainer.node_dir import page_bytes; " \
           "print(page_bytes(Path(sys.argv[1]) / 'nvrx-eks' / 'run'))"
    script = f"mount -t tmpfs -o huge={huge},size=16m none \"$1\" && exec \"$2\" -c \"$3\" \"$1\""
    proc = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script, "sh",
                           str(point), sys.executable, code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) == expected


def test_a_directory_on_a_disk_is_on_base_pages(tmp_path):
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True,
                          text=True).stdout.strip()
    if kind in ("tmpfs", "hugetlbfs"):
        pytest.skip("the temporary directory is itself a memory file system here")
    assert page_bytes(tmp_path) == SMALL
