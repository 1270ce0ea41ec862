"""A small kubectl runner: prints instead of running under --dry_run, and fails early and clearly.

Every command goes through `argv()`, so dry-run output is exactly what a real run executes.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import TextIO


class WrapperError(Exception):
    """An input or environment problem; shown as one line, exit code 2."""

    exit_code = 2


class KubectlFailed(Exception):
    """kubectl itself failed; the wrapper exits with its return code."""

    def __init__(self, argv: list[str], returncode: int, stderr: str = "") -> None:
        detail = f": {stderr.strip().splitlines()[-1]}" if stderr.strip() else ""
        super().__init__(f"`{shlex.join(argv)}` failed with exit code {returncode}{detail}")
        self.returncode = returncode


@dataclass
class Kubectl:
    """kubectl bound to one namespace (and optionally one context)."""

    namespace: str
    context: str | None = None
    dry_run: bool = False
    binary: str = "kubectl"
    out: TextIO | None = None  # None: the current sys.stdout

    def argv(self, *args: str) -> list[str]:
        base = [self.binary]
        if self.context:
            base += ["--context", self.context]
        return [*base, "--namespace", self.namespace, *args]

    def show(self, line: str) -> None:
        print(line, file=self.out or sys.stdout, flush=True)

    def run(self, *args: str, check: bool = True) -> int:
        """Run with output streamed to the terminal (or print the command under --dry_run)."""
        argv = self.argv(*args)
        if self.dry_run:
            self.show(shlex.join(argv))
            return 0
        proc = subprocess.run(argv)
        if check and proc.returncode != 0:
            raise KubectlFailed(argv, proc.returncode)
        return proc.returncode

    def query(self, *args: str) -> str:
        """Run and return stdout; never called under --dry_run (callers print a composite)."""
        if self.dry_run:
            raise WrapperError("internal: a cluster query cannot run under --dry_run")
        argv = self.argv(*args)
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise KubectlFailed(argv, proc.returncode, proc.stderr)
        return proc.stdout

    def preflight(self, cluster_name: str | None, kubeconfig_hint: str) -> None:
        """kubectl on PATH, a usable context, and (when known) the stack's cluster behind it."""
        if shutil.which(self.binary) is None:
            raise WrapperError(f"{self.binary} not found on PATH: install kubectl, then run `{kubeconfig_hint}`")
        proc = subprocess.run([self.binary, "config", "view", "-o", "json"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise WrapperError(f"cannot read the kubeconfig ({proc.stderr.strip()}); run `{kubeconfig_hint}`")
        try:
            config = json.loads(proc.stdout or "{}")
        except json.JSONDecodeError:
            raise WrapperError(f"`{self.binary} config view` did not return JSON; run `{kubeconfig_hint}`") from None
        name = self.context or config.get("current-context") or ""
        if not name:
            raise WrapperError(f"no current kube context: run `{kubeconfig_hint}` or pass --context")
        contexts = {c.get("name"): c.get("context") or {} for c in config.get("contexts") or []}
        if name not in contexts:
            raise WrapperError(f"kube context {name!r} is not in the kubeconfig: run `{kubeconfig_hint}`")
        cluster = contexts[name].get("cluster", "")
        if cluster_name and cluster != cluster_name and not cluster.endswith(f"/{cluster_name}"):
            raise WrapperError(
                f"kube context {name!r} points at cluster {cluster!r}, not {cluster_name!r} "
                f"from the outputs: run `{kubeconfig_hint}` or pass --context"
            )
