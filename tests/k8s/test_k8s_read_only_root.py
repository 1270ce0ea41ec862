"""Every container runs with a read-only root filesystem, and the trainer needs nothing more.

The real check: a short job in a private mount namespace whose root is read-only, as in a pod,
where only the pod's writable volumes are writable: a fresh tmpfs at the scratch mount (/tmp,
also HOME) and /dev/shm, which also stands in for FSx here. A write anywhere else fails the job.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from k8s.deployment import SCRATCH_MOUNT
from tests.jobs import ROOT, env_for, local_cmd

SHM = Path("/dev/shm")


def containers(synthesis) -> list[dict]:
    out = []
    for doc in synthesis.docs():
        if doc["kind"] in ("Job", "Pod"):
            spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
            out += [*spec.get("initContainers", []), *spec["containers"]]
    return out


def test_every_container_has_a_read_only_root(synthesis) -> None:
    for container in containers(synthesis):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, container["name"]


def test_python_containers_write_home_and_temp_files_to_the_scratch_volume(synthesis) -> None:
    python = [c for c in containers(synthesis) if c["command"][0] == "python"]
    assert {c["name"] for c in python} == {"trainer", "data-prep"}
    for container in python:
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert env["HOME"] == SCRATCH_MOUNT and not mounts[SCRATCH_MOUNT].get("readOnly")


@pytest.mark.parametrize("mode", ["baseline", "ft_launcher+inprocess"])
def test_trainer_runs_with_only_the_pods_writable_paths(mode: str) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare (Linux) for a private mount namespace")
    work = Path(tempfile.mkdtemp(dir=SHM, prefix="nvrx-eks-read-only-"))
    try:
        job = local_cmd(mode, work / "run", "--max_steps", "6", "--checkpoint_interval", "3")
        env = {**env_for(work / "cache"), "HOME": SCRATCH_MOUNT}
        script = "\n".join([
            "set -eu",
            "mount --make-rprivate /",
            f"mount -t tmpfs scratch {SCRATCH_MOUNT}",
            "mount -o remount,bind,ro /",
            "if touch /.nvrx-eks-probe 2>/dev/null; then echo 'root is writable' >&2; exit 97; fi",
            f"cd {shlex.quote(str(ROOT))}",
            "exec " + shlex.join(job),
        ])  # fmt: skip
        proc = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert (work / "run" / "results.json").is_file()
    finally:
        shutil.rmtree(work, ignore_errors=True)
