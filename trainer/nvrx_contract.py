"""What the trainer needs of NVRx's internals, checked before anything is launched.

`trainer.nvrx_compat` wraps or replaces a few private NVRx symbols where NVRx offers
no public hook (docs/recovery.md, "NVRx's private symbols", gives each one's reason and what
NVRx would need to expose). A release that renames one would otherwise show only at the first
fault, as a restart that silently behaves differently. So the launchers (`launch.check`, which
`devtools.local` runs too) refuse, with one line and exit 2, an NVRx release outside the tested
range or one that lacks a symbol listed here for it.

The check reads the installed sources (no import: importing NVRx's launcher costs seconds at
every pod start); `tests/trainer/recovery/test_nvrx_contract.py` imports every symbol for real
on each NVRx that `make test` installs (0.4.1 and the image's 0.7).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Optional

from config.versions import nvrx_release

PACKAGE = "nvidia_resiliency_ext"
DISTRIBUTION = "nvidia-resiliency-ext"
ANY = ((0, 4), (0, 7))  # every release the trainer runs on (config.versions)


@dataclass(frozen=True)
class Private:
    """A private NVRx symbol, `module` (under nvidia_resiliency_ext) and `name` (dotted inside
    it), that `patch` (a function of nvrx_compat) wraps, replaces or reads, on the releases
    from `releases[0]` through `releases[1]` (major, minor)."""

    module: str
    name: str
    patch: str
    releases: tuple[tuple[int, int], tuple[int, int]] = ANY

    @property
    def symbol(self) -> str:
        return f"{PACKAGE}.{self.module}:{self.name}"

    def applies(self, release: tuple[int, ...]) -> bool:
        return self.releases[0] <= release[:2] <= self.releases[1]


_C10D = ((0, 4), (0, 5))  # ft_launcher's c10d rendezvous, before the barrier one
PRIVATE = (
    Private("checkpointing.async_ckpt.core", "AsyncCallsQueue._get_async_caller", "AsyncWriter"),
    Private("checkpointing.async_ckpt.core", "PersistentAsyncCaller.async_loop", "AsyncWriter"),
    Private("fault_tolerance.launcher", "terminate_mp_processes", "use_stop_worker_groups",
            ((0, 7), (0, 7))),
    Private("fault_tolerance.launcher", "LocalElasticAgent._start_workers",
            "use_round_in_worker_env"),
    Private("fault_tolerance.launcher", "start_processes", "use_round_in_worker_env"),
    Private("fault_tolerance.launcher", "LocalElasticAgent._monitor_workers",
            "watch_worker_failures"),
    Private("fault_tolerance.rank_monitor_server", "RankMonitorServer.run",
            "use_rank_monitors_following_launcher"),
    Private("fault_tolerance.rank_monitor_server", "RankMonitorServer._handle_timeout",
            "watch_heartbeat_timeouts"),
    Private("fault_tolerance._ft_rendezvous", "create_handler", "use_rendezvous_keep_alive",
            _C10D),
    Private("fault_tolerance._ft_rendezvous", "FtRendezvousHandler.num_nodes_waiting",
            "use_lost_participant_restart", _C10D),
    Private("fault_tolerance._ft_rendezvous", "FtRendezvousHandler.next_rendezvous",
            "use_lost_participant_restart", _C10D),
    Private("fault_tolerance._ft_rendezvous", "_RendezvousJoinOp.__call__",
            "use_seated_nodes_first", _C10D),
    Private("fault_tolerance.ft_rendezvous_barrier",
            "_RendezvousBarrierState._wait_for_rendezvous_open", "use_prompt_rendezvous",
            ((0, 7), (0, 7))),
    Private("fault_tolerance.ft_rendezvous_barrier",
            "_RendezvousBarrierState._sync_from_per_round_state", "use_prompt_rendezvous",
            ((0, 7), (0, 7))),
    Private("inprocess.monitor_process", "terminate_process", "record_watchdog_kills"),
    Private("inprocess.store", "StoreMixin.get_interruption_records", "interruption_records"),
)


def installed_version() -> Optional[str]:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return None


def _package_dir() -> Optional[Path]:
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, ast.AnnAssign) else []
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """`body` with the bodies of its if/try blocks (conditional definitions) spliced in."""
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out += _statements(node.body) + _statements(node.orelse)
        elif isinstance(node, ast.Try):
            out += _statements(node.body) + _statements(node.orelse) + \
                [s for h in node.handlers for s in _statements(h.body)]
    return out


def defined(source: str, name: str) -> bool:
    """Whether `source` defines `name` ("Class.method", "function", "imported_name")."""
    body = ast.parse(source).body
    parts = name.split(".")
    for i, part in enumerate(parts):
        node = next((n for n in _statements(body) if part in _bound_names(n)), None)
        if node is None:
            return False
        if i < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                return False
            body = node.body
    return True


def problems() -> list[str]:
    """What keeps the installed NVRx from running the trainer as tested; [] when nothing."""
    installed = installed_version()
    if installed is None:
        return [f"{DISTRIBUTION} is not installed (pip install '.[trainer]')"]
    try:
        release = nvrx_release(installed)
    except ValueError as exc:
        return [f"installed {exc}"]
    root = _package_dir()
    missing = []
    for private in PRIVATE:
        if not private.applies(release):
            continue
        path = root / (private.module.replace(".", "/") + ".py") if root else None
        if path is None or not path.is_file() or not defined(path.read_text(), private.name):
            missing.append(private.symbol)
    if missing:
        return [f"NVRx {installed} lacks {', '.join(missing)}, which the trainer wraps "
                "(docs/recovery.md, NVRx's private symbols): use a tested release"]
    return []
