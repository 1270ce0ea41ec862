"""The NVRx contract (`trainer.nvrx_contract`): every private symbol the trainer wraps
exists on the installed NVRx (0.4.1 in make test's main leg, the image's 0.7 in its image leg),
and a release that lacks one, or lies outside the tested range, is refused before launch."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

from tests.jobs import ROOT
from trainer import nvrx_compat, nvrx_contract
from trainer.nvrx_contract import PACKAGE, PRIVATE, defined, problems

RELEASE = tuple(int(x) for x in nvrx_contract.installed_version().split(".")[:2])


@pytest.mark.parametrize("private", [p for p in PRIVATE if p.applies(RELEASE)],
                         ids=lambda p: f"{p.module}:{p.name}")
def test_every_wrapped_symbol_imports_on_the_installed_nvrx(private):
    obj = importlib.import_module(f"{PACKAGE}.{private.module}")
    for part in private.name.split("."):
        obj = getattr(obj, part)  # AttributeError: NVRx changed underneath the patch
    assert callable(obj)


def test_the_installed_nvrx_passes_the_start_up_check():
    assert problems() == []


def test_every_entry_names_the_patch_that_uses_it():
    for private in PRIVATE:
        assert hasattr(nvrx_compat, private.patch), private.patch


def test_the_recovery_docs_list_every_wrapped_symbol():
    text = (ROOT / "docs" / "recovery.md").read_text()
    for private in PRIVATE:
        assert f"`{private.module}:{private.name}`" in text, private.symbol


def test_a_symbol_is_found_in_source_where_it_is_defined():
    source = ("import os\nfrom x import start_processes\nclass A:\n    def m(self): pass\n"
              "    async def n(self): pass\n    B = 1\n"
              "try:\n    def late(): pass\nexcept ImportError:\n    pass\n")
    for name in ("A.m", "A.n", "A.B", "start_processes", "late", "os"):
        assert defined(source, name), name
    for name in ("A.gone", "gone", "os.path", "late.inner"):
        assert not defined(source, name), name


@pytest.mark.parametrize("version, expected", [
    ("0.8.0", r"nvrx_version '0.8.0' is not one the trainer runs on"),
    ("0.3.9", r"nvrx_version '0.3.9' is not one the trainer runs on"),
    (None, r"nvidia-resiliency-ext is not installed"),
])
def test_a_release_outside_the_tested_range_is_refused(monkeypatch, version, expected):
    monkeypatch.setattr(nvrx_contract, "installed_version", lambda: version)
    found = problems()
    assert len(found) == 1 and re.search(expected, found[0]), found


def test_a_release_without_a_wrapped_symbol_is_refused(monkeypatch):
    gone = nvrx_contract.Private("inprocess.store", "StoreMixin.renamed_away", "interruption_records")
    monkeypatch.setattr(nvrx_contract, "PRIVATE", (*PRIVATE, gone))
    found = problems()
    assert len(found) == 1 and "inprocess.store:StoreMixin.renamed_away" in found[0], found


def test_the_launcher_refuses_an_untested_nvrx_with_one_line_and_exit_2(tmp_path):
    """The pods' launcher, before it starts anything: an NVRx that lacks a wrapped symbol is
    simulated with a copy of NVRx's package whose store module lost the method."""
    import shutil

    from trainer.nvrx_contract import _package_dir

    site = tmp_path / "site"
    shutil.copytree(_package_dir(), site / PACKAGE)
    for info in _package_dir().parent.glob("nvidia_resiliency_ext-*.dist-info"):
        shutil.copytree(info, site / info.name)
    store = site / PACKAGE / "inprocess" / "store.py"
    store.write_text(store.read_text().replace("def get_interruption_records", "def renamed"))
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
         "from trainer.recovery.launch import main; sys.exit(main())",
         "--mode", "ft_launcher", "--nnodes", "1", "--nproc_per_node", "1", "--node_rank", "0", "--master_addr", "127.0.0.1", "--",
         "--model", "tiny", "--max_steps", "1", "--checkpoint_dir", str(tmp_path / "ckpt")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "inprocess.store:StoreMixin.get_interruption_records" in lines[0]
    assert not (tmp_path / "ckpt").exists()


def test_the_gpu_memory_poll_flag_is_passed_exactly_where_ft_launcher_has_it():
    """`_reclaims_gpu_memory` decides by the version, so that launchers never import torch; the
    installed NVRx's own config says whether the flag exists."""
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig

    from trainer.nvrx_compat import _reclaims_gpu_memory

    assert _reclaims_gpu_memory() == hasattr(FaultToleranceConfig, "gpu_memory_poll_interval")
