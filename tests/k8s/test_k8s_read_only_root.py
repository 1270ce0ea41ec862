"""Every container runs with a read-only root filesystem, and the trainer needs nothing more.

The real check: a short job in a private mount namespace whose root is read-only, as in a pod,
where only the pod's writable volumes are writable: a fresh tmpfs at the scratch mount (/tmp,
also HOME) and /dev/shm, which also stands in for FSx here. A write anywhere else fails the job.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
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
    assert {c["name"] for c in python} == {"trainer", "data-prep", "export"}
    for container in python:
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert env["HOME"] == SCRATCH_MOUNT and not mounts[SCRATCH_MOUNT].get("readOnly")


def _under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def _outermost(paths: list[Path], top: Path) -> list[Path]:
    """The `paths` under `top` that lie inside no other of them: one mount covers each."""
    return [p for p in paths if _under(p, top) and not any(q != p and _under(p, q) for q in paths)]


def pod_script(checkout: Path, job: list[str], stage: Path) -> str:
    """The shell script that makes this mount namespace look like a pod, then runs `job` from
    `checkout`: / read-only, a fresh tmpfs at the scratch mount. The checkout and the
    interpreter stay visible (read-only) where they are, also under the scratch mount (a clone
    in /tmp): each is bound to `stage` first, then moved into the tmpfs at its own path. Under
    /dev/shm, which stays writable as in a pod, each is bound read-only onto itself (a clone in
    /dev/shm), so a write into the checkout still fails the job."""
    needed = sorted({checkout, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()})
    kept = _outermost(needed, Path(SCRATCH_MOUNT))
    q = shlex.quote
    lines = ["set -eu", "mount --make-rprivate /"]
    for i, path in enumerate(kept):
        lines += [f"mkdir -p {q(str(stage / str(i)))}", f"mount --bind {q(str(path))} {q(str(stage / str(i)))}"]
    lines.append(f"mount -t tmpfs scratch {q(SCRATCH_MOUNT)}")
    for i, path in enumerate(kept):
        lines += [f"mkdir -p {q(str(path))}", f"mount --move {q(str(stage / str(i)))} {q(str(path))}",
                  f"mount -o remount,bind,ro {q(str(path))}"]
    for path in _outermost(needed, SHM):
        lines += [f"mount --bind {q(str(path))} {q(str(path))}", f"mount -o remount,bind,ro {q(str(path))}"]
    lines += ["mount -o remount,bind,ro /",
              "if touch /.nvrx-eks-probe 2>/dev/null; then echo 'root is writable' >&2; exit 97; fi",
              f"cd {q(str(checkout))}", "exec " + shlex.join(job)]
    return "\n".join(lines)


def run_in_pod_namespace(script: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("read_only_parent", [False, True], ids=["", "read-only-parent"])
@pytest.mark.parametrize("top", [SCRATCH_MOUNT, str(SHM)])
def test_the_checkout_stays_visible_and_read_only_under_a_writable_mount(
        top: str, read_only_parent: bool) -> None:
    """A clone in /tmp (the scratch mount): the tmpfs over /tmp must not hide it. A clone in
    /dev/shm (writable in a pod too) must still be read-only. Either may sit in a folder the
    user cannot write. The clone is played by this checkout bound onto a directory under `top`
    inside the namespace, its parent made read-only first where asked."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare (Linux) for a private mount namespace")
    parent = Path(tempfile.mkdtemp(dir=top, prefix="nvrx-eks parent-"))
    clone = parent / "nvrx-eks clone"
    clone.mkdir()
    stage = Path(tempfile.mkdtemp(dir=SHM, prefix="nvrx-eks-stage-"))
    hidden, marker = tempfile.mkstemp(dir=SCRATCH_MOUNT, prefix="nvrx-eks-host-file-")
    os.close(hidden)
    q = shlex.quote
    try:
        # the checkout visible and read-only; the host's own scratch files hidden by the tmpfs
        probe = ["sh", "-c", "test -f pyproject.toml && ! touch pyproject.toml 2>/dev/null "
                 f"&& ! test -e {q(marker)} && echo visible"]
        lines = ["set -eu", "mount --make-rprivate /"]
        if read_only_parent:
            lines += [f"mount --bind {q(str(parent))} {q(str(parent))}",
                      f"mount -o remount,bind,ro {q(str(parent))}",
                      f"if touch {q(str(parent / 'probe'))} 2>/dev/null; then exit 98; fi"]
        lines += [f"mount --bind {q(str(ROOT))} {q(str(clone))}", pod_script(clone, probe, stage)]
        proc = run_in_pod_namespace("\n".join(lines), dict(os.environ))
        assert proc.returncode == 0 and proc.stdout.strip() == "visible", \
            f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(parent, ignore_errors=True)
        os.unlink(marker)


@pytest.mark.parametrize("mode", ["baseline", "ft_launcher+inprocess"])
def test_trainer_runs_with_only_the_pods_writable_paths(mode: str) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare (Linux) for a private mount namespace")
    work = Path(tempfile.mkdtemp(dir=SHM, prefix="nvrx-eks-read-only-"))
    try:
        job = local_cmd(mode, work / "run", "--max_steps", "6", "--checkpoint_interval", "3")
        env = {**env_for(work / "cache"), "HOME": SCRATCH_MOUNT}
        proc = run_in_pod_namespace(pod_script(ROOT, job, work / "stage"), env)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert (work / "run" / "results.json").is_file()
    finally:
        shutil.rmtree(work, ignore_errors=True)
