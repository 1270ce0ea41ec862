"""`python -m bench.scrub FILE...`: result files without the paths of the machine that wrote them.

A result file records command lines and the trainer's settings, which hold absolute paths: the
interpreter of a virtual environment, a work tree, a temporary directory. They say nothing
about the result and differ between machines. Every string in the JSON (keys too) is rewritten:

- an interpreter (`.../bin/python3.12`) becomes `python`;
- a path under the repository root, or under another checkout of it (`/work/main/runs/...`,
  recognised by a top-level entry of this repository: `runs`, `bench`, `trainer`, ...),
  becomes relative to that root (`runs/...`);
- a path under a temporary directory (`/tmp/nl07d/runs/spare-kill`) becomes `<tmp>/` and the
  path below its first component (`<tmp>/runs/spare-kill`);
- any other path under a home or work directory becomes `<elsewhere>/` and its last component.

Mount points the commands name on purpose (`/dev/shm`, `/mnt/hugeshm`) stay. `bench.run` and
`bench.node_loss` call `scrub` before they write; this command cleans files written before.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
# Roots under which a path belongs to one machine: its users, work trees, installs, temp files.
MACHINE_ROOTS = ("/work/", "/home/", "/root/", "/opt/", "/tmp/", "/var/tmp/", "/Users/", "/usr/local/")
# An absolute path inside a string: not preceded by a word character or a dot ("GB/s", "./x").
_PATH = re.compile(r"(?<![\w.~<>])/[^\s\"'=,;:()\[\]{}]+")
_INTERPRETER = re.compile(r".*/bin/python[0-9.]*")


def _temp_roots() -> tuple[str, ...]:
    roots = {"/tmp/", "/var/tmp/", tempfile.gettempdir().rstrip("/") + "/"}
    return tuple(sorted(roots, key=len, reverse=True))


def _repo_entries(root: Path) -> frozenset[str]:
    """The repository's top-level names that mark a path as inside a checkout of it."""
    names = {"runs", "bench", "trainer", "devtools", "config", "k8s", "infra", "scripts", "tests",
             "docs", ".venv", ".whl"}
    if root.is_dir():
        names |= {p.name for p in root.iterdir() if p.is_dir() and p.name not in (".git", ".cache")}
    return frozenset(names)


def scrub_path(path: str, root: Path = ROOT) -> str:
    """One absolute path as the rules of this module rewrite it; other strings unchanged."""
    if not path.startswith("/"):
        return path
    if _INTERPRETER.fullmatch(path):
        return "python"
    base = str(root).rstrip("/")
    if path == base:
        return "."
    if path.startswith(base + "/"):
        return path[len(base) + 1:]
    for tmp in _temp_roots():
        if path.startswith(tmp):
            rest = path[len(tmp):].split("/", 1)
            return "<tmp>/" + rest[1] if len(rest) > 1 and rest[1] else "<tmp>"
    if not path.startswith(MACHINE_ROOTS):
        return path
    parts = path.strip("/").split("/")
    entries = _repo_entries(root)
    for i, part in enumerate(parts[1:], start=1):
        if part in entries:
            return "/".join(parts[i:])
    return "<elsewhere>/" + parts[-1]


def scrub_text(text: str, root: Path = ROOT) -> str:
    """Every absolute path in `text` (a command line, a message) rewritten."""
    return _PATH.sub(lambda m: scrub_path(m.group(0), root), text)


def scrub(obj: Any, root: Path = ROOT) -> Any:
    """A copy of a JSON value with every string (keys included) scrubbed."""
    if isinstance(obj, str):
        return scrub_text(obj, root)
    if isinstance(obj, dict):
        return {scrub_text(k, root) if isinstance(k, str) else k: scrub(v, root)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v, root) for v in obj]
    return obj


def scrub_file(path: Path, root: Path = ROOT) -> bool:
    """Rewrite one JSON file in place, keeping its indentation style; True if it changed."""
    text = path.read_text()
    data = json.loads(text)
    clean = scrub(data, root)
    if clean == data:
        return False
    indent: Optional[int] = None
    m = re.search(r"\n( +)\S", text)
    if m:
        indent = len(m.group(1))
    path.write_text(json.dumps(clean, indent=indent) + ("\n" if text.endswith("\n") else ""))
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scrub", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="JSON result files, rewritten in place")
    a = p.parse_args(argv)
    for f in a.files:
        try:
            changed = scrub_file(f)
        except (OSError, json.JSONDecodeError) as exc:
            print(f"python -m bench.scrub: error: {f}: {exc}", file=sys.stderr)
            return 2
        print(f"{f}: {'scrubbed' if changed else 'clean'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
