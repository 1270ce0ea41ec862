"""Every exception class the project defines has an entry in docs/troubleshooting.md: a new error
class without one fails here. The classes are found by reading the source (AST), not listed."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "devtools", "scripts", "k8s", "config", "infra", "bench")
PAGE = REPO / "docs" / "troubleshooting.md"


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def exception_classes() -> dict[str, str]:
    """name -> file of every class in PACKAGES deriving, directly or through another class found
    here, from a built-in exception."""
    bases: dict[str, tuple[str, list[str]]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    names = [n for n in map(_base_name, node.bases) if n]
                    bases[node.name] = (str(path.relative_to(REPO)), names)
    found: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for name, (path, parents) in bases.items():
            if name not in found and any(p in found or _builtin_exception(p) for p in parents):
                found[name] = path
                grew = True
    return found


def test_the_search_finds_the_known_kinds():
    found = exception_classes()
    # one of each way a class derives: a built-in directly, a project class, two parents
    assert {"ConfigError", "DataError", "StorageError", "KubectlFailed"} <= found.keys()
    assert "Profile" not in found and "TrainConfig" not in found


def test_every_exception_class_has_a_troubleshooting_entry():
    page = PAGE.read_text()
    missing = {name: path for name, path in exception_classes().items()
               if not re.search(rf"`{re.escape(name)}`", page)}
    assert missing == {}, "add these to docs/troubleshooting.md's table of exception classes"


def test_the_page_is_linked_from_the_readme():
    assert "(docs/troubleshooting.md)" in (REPO / "README.md").read_text()
