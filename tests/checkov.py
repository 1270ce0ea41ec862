"""checkov, the IaC scanner, run offline from the project's own install.

One checkov process per framework over a whole directory (or a list of files): starting checkov
costs seconds, scanning a file milliseconds. `--skip-download` keeps it off the Bridgecrew
platform, and the PyPI update check is turned off, so nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKOV = ROOT / ".cache" / "checkov" / "bin" / "checkov"
OFFLINE_ENV = {"CKV_SKIP_PACKAGE_UPDATE_CHECK": "true"}


@dataclass(frozen=True)
class Scan:
    """One framework's results: checks by outcome, each a checkov result record."""

    passed: list[dict]
    failed: list[dict]
    skipped: list[dict]
    parsing_errors: list[str]

    def resources(self) -> set[str]:
        """Every resource checkov evaluated, e.g. 'Job.nvrx.data-prep'."""
        return {r["resource"] for r in (*self.passed, *self.failed, *self.skipped)}

    def failures(self) -> str:
        return describe(self.failed)


def describe(records: list[dict]) -> str:
    """One line per result: the check, what it asks, and where."""
    return "\n".join(f"{r['check_id']} {r['check_name']}: {r['resource']} in {r['file_path']}" for r in records)


def checkov_command(framework: str, *targets: Path) -> list[str]:
    # run by its venv's interpreter: the script's shebang breaks where the checkout's path has a space
    args = [str(CHECKOV.parent / "python3"), str(CHECKOV), "--framework", framework,
            "--skip-download", "--output", "json", "--compact"]
    for target in targets:
        args += ["--directory" if target.is_dir() else "--file", str(target)]
    return args


def scan(framework: str, *targets: Path, prefix: tuple[str, ...] = ()) -> Scan:
    """Scan `targets` with one checkov process; `prefix` wraps the command (e.g. in unshare)."""
    if not CHECKOV.exists():
        pytest.fail(f"checkov not installed at {CHECKOV.relative_to(ROOT)}: run `make {CHECKOV.relative_to(ROOT)}` "
                    "(make test does)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKV_", "BC_", "PRISMA_"))} | OFFLINE_ENV
    proc = subprocess.run([*prefix, *checkov_command(framework, *targets)], env=env, capture_output=True, text=True)
    # Exit 1 means failed checks, which the report below shows; anything else is checkov failing.
    assert proc.returncode in (0, 1), f"checkov exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    report = json.loads(proc.stdout)
    found = isinstance(report, dict) and report.get("check_type") == framework
    assert found, f"no {framework} results (nothing scanned?): {proc.stdout[:500]}"
    results = report["results"]
    return Scan(
        passed=results.get("passed_checks", []),
        failed=results.get("failed_checks", []),
        skipped=results.get("skipped_checks", []),
        parsing_errors=results.get("parsing_errors", []),
    )
