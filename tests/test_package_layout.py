"""The packages import one way, toward `config`. The runtime package stands alone: the image
installs `trainer` with the `[trainer]` extra only, so nothing in it may need the developer tools
or their libraries, and the manifests' side reads the trainer's settings without importing torch."""

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


def test_data_preparation_needs_no_torch_and_the_image_gets_it():
    """`[data]` alone prepares data on a machine without torch; `[trainer]`, which the image
    installs, brings it for the data-prep Job."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {req.split(">")[0].split("=")[0].split("<")[0].strip() for req in extras["data"]}
    assert "datasets" in names and names.isdisjoint({"torch", "nvidia-resiliency-ext"})
    assert "nvrx-eks[data]" in extras["trainer"]


def test_manifest_side_reads_trainer_settings_without_torch():
    code = ("import sys, k8s.resources, k8s.deployment, scripts.plan, trainer.config, "
            "trainer.loop.model; sys.exit('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:] or "torch was imported"


PACKAGES = ("config", "trainer", "k8s", "infra", "scripts", "devtools", "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path, known: set[str]) -> set[str]:
    """Every project module `path` imports, at module level or inside a function (a deferred
    import is still a dependency), resolved to the longest known module name."""
    out = set()
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def test_no_import_cycles():
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    known = {module_name(p) for p in files}
    graph = {module_name(p): project_imports(p, known) - {module_name(p)} for p in files}
    # A package's __init__ importing its own modules is how a package exports: not a cycle.
    for mod in graph:
        graph[mod] = {dep for dep in graph[mod] if not (dep in graph and mod.startswith(dep + "."))}
    cycles, state = [], {}

    def visit(mod: str, stack: list[str]) -> None:
        state[mod] = "open"
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[mod] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    assert cycles == []


# Which of the project's packages each one may import: arrows point one way, toward `config`
# (the one source of settings). The manifests' side never imports the wrapper or the trainer.
MAY_IMPORT = {
    "config": set(),
    "trainer": {"config"},
    "k8s": {"config"},
    "infra": {"config"},
    "scripts": {"config", "k8s"},
    "devtools": {"config", "trainer"},
    "bench": {"config", "trainer", "devtools"},
}


def test_packages_import_one_way():
    assert set(MAY_IMPORT) == set(PACKAGES)
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    known = {module_name(p) for p in files}
    wrong = []
    for path in files:
        module = module_name(path)
        own = module.split(".")[0]
        wrong += [f"{module} -> {dep}" for dep in sorted(project_imports(path, known))
                  if dep.split(".")[0] not in MAY_IMPORT[own] | {own}]
    assert wrong == []


# Inside the trainer, from the bottom up: the helpers every part uses (top-level modules such as
# `distributed`, `lifetime`, `phases`, `nvrx_compat`, and `accounting`, `faults`); the two tiers
# of state; what the loop is given (`hooks`) and reports through (`telemetry`); `tiers`, which
# composes the tiers; the loop; the recovery layers around it; the entry points.
TRAINER_LAYERS = ({"durable", "snapshots"}, {"hooks", "telemetry"}, {"tiers"}, {"loop"},
                  {"recovery", "preflight"}, {"cli", "__main__", "export"})


def _trainer_layer(module: str) -> int:
    part = module.split(".")[1] if module.count(".") >= 1 else module
    return next((i + 1 for i, layer in enumerate(TRAINER_LAYERS) if part in layer), 0)


def test_the_trainers_layers_import_downward():
    files = list((REPO / "trainer").rglob("*.py"))
    known = {module_name(p) for p in files}
    upward = sorted(f"{module_name(p)} -> {dep}" for p in files for dep in project_imports(p, known)
                    if dep.startswith("trainer.")
                    and _trainer_layer(dep) > _trainer_layer(module_name(p)))
    assert upward == []
