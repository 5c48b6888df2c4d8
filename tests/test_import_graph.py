"""The packages' imports form no loop, and the layers keep their direction.

Every import statement counts: at module level, inside functions and under TYPE_CHECKING, since
each one says that a module needs another. A loop means two modules that can only be read
together. The layers, lowest first: the kernels; the engine (runtime/: the model, its caches,
tensor parallelism); the proposers and the planning; the decoding loop; serving (and the
offline commands, and the hooks tests attach to it); the launcher, the gateway and the CLI.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The packages as they are imported: client/ installs as specdec_client.
PACKAGES = {"specdec": ROOT / "specdec", "specdec_client": ROOT / "client"}
# Each layer's packages, lowest first; a module imports nothing from a layer above its own.
# records.py and names.py (the records and names every layer passes) sit below them all.
LAYERS = [("specdec.kernels",),
          ("specdec.runtime",),
          ("specdec.proposers", "specdec.planning"),
          ("specdec.decoding",),
          ("specdec.hooks", "specdec.serving", "specdec.tune", "specdec.distill"),
          ("specdec.launcher", "specdec.openai", "specdec.cli")]
# The one import against the layers: the launcher's earlier command, kept for deployments
# that run `python -m specdec.serving.launch`.
KEPT = {"specdec.serving.launch": "specdec.launcher.launch"}


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted name -> file, for every module of the packages."""
    out = {}
    for name, root in packages.items():
        for path in root.rglob("*.py"):
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(packages: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the packages' modules it imports (any import statement in it)."""
    mods = modules(packages)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
        graph[name] = {m for m in found if m in mods and m != name}
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_a_loop_is_found_where_there_is_one(tmp_path):
    """The walk itself: a type-only import back from a module it imports is a loop; the same
    import gone, none."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from ..a import A\n")
    assert loops(imports({"pkg": pkg})) == [["pkg.a", "pkg.sub.b"]]
    (pkg / "sub" / "b.py").write_text("import json\n")
    assert loops(imports({"pkg": pkg})) == []


def test_no_import_loops():
    assert loops(imports(PACKAGES)) == []


def layer(module: str) -> int | None:
    for i, packages in enumerate(LAYERS):
        if module.startswith(packages):
            return i
    return None


def upward(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Module -> the modules of a higher layer it imports."""
    out = {}
    for m, deps in graph.items():
        own = layer(m)
        up = sorted(d for d in deps if own is not None and layer(d) is not None
                    and layer(d) > own and KEPT.get(m) != d)
        if up:
            out[m] = up
    return out


def test_an_upward_import_is_found(tmp_path):
    """The layer walk itself: the engine importing the policy is found; the other way, not."""
    pkg = tmp_path / "specdec"
    for d in ("runtime", "planning"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime" / "engine.py").write_text("from ..planning import policy\n")
    (pkg / "planning" / "policy.py").write_text("")
    assert upward(imports({"specdec": pkg})) == {
        "specdec.runtime.engine": ["specdec.planning", "specdec.planning.policy"]}
    (pkg / "runtime" / "engine.py").write_text("")
    (pkg / "planning" / "policy.py").write_text("from ..runtime import engine\n")
    assert upward(imports({"specdec": pkg})) == {}


def test_every_package_has_its_layer():
    """A new package is placed in LAYERS, or nothing checks what it imports."""
    packages = {".".join(m.split(".")[:2]) for m in modules(PACKAGES)
                if m.startswith("specdec.") and (ROOT / "specdec" / m.split(".")[1]).is_dir()}
    assert {p for p in packages if layer(p) is None} == set()


def test_no_layer_imports_one_above_it():
    """Above all: the engine imports nothing of the proposers, the planning, the loop or
    serving (the drafters in the target's process are attached to it from outside)."""
    assert upward(imports(PACKAGES)) == {}


def test_serving_imports_the_hooks_only_where_a_setting_asks():
    """hooks/ (a simulated device, injected faults) is for tests and benchmarks: loading the
    serving modules, the engine models' among them, imports none of it."""
    code = ("import sys, specdec.serving.engine_model, specdec.serving.engine_settings, "
            "specdec.serving.orchestrator, specdec.serving.hosted, specdec.serving.drafters; "
            "print(sorted(m for m in sys.modules if m.startswith('specdec.hooks')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", ["specdec.decoding.loop", "specdec_client"])
def test_the_loop_and_the_client_import_no_torch(module):
    """The loop speaks to a drafter and a verifier, whatever computes them; the client runs
    where torch is not installed."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
