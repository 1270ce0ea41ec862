"""The runtime package stands alone: the image installs `trainer` with the `[trainer]` extra only,
so nothing in it may need the developer tools or their libraries, and the manifests' side reads
the trainer's settings without importing torch."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEV_ONLY = {"devtools", "matplotlib", "pytest", "hypothesis", "aws_cdk", "cdk8s", "cdk8s_plus_35"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_runtime_package_imports_no_developer_tool():
    offenders = {str(p.relative_to(REPO)): sorted(imported_roots(p) & DEV_ONLY)
                 for p in (REPO / "trainer").rglob("*.py")}
    assert {f: mods for f, mods in offenders.items() if mods} == {}


def test_the_trainer_extra_carries_no_plotting_or_cloud_sdk():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {req.split(">")[0].split("=")[0].split("<")[0].strip() for req in extras["trainer"]}
    assert names.isdisjoint({"matplotlib", "aws-cdk-lib", "cdk8s", "boto3", "pytest"})


def test_manifest_side_reads_trainer_settings_without_torch():
    code = ("import sys, k8s.resources, k8s.trainer_check, scripts.plan, trainer.config, "
            "trainer.loop.model; sys.exit('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:] or "torch was imported"
