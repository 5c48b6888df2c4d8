"""The packages' imports form no loop, and the layers keep their direction.

Every import statement counts: at module level, inside functions and under TYPE_CHECKING, since
each one says that a module needs another. A loop means two modules that can only be read
together; the layers are the engine (the model's arithmetic, its caches and kernels), the loop
and its policy above it, and serving above both.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The packages as they are imported: client/ installs as specdec_client.
PACKAGES = {"specdec": ROOT / "specdec", "specdec_client": ROOT / "client"}
# The engine's modules import nothing of what sits above them.
ENGINE = ("specdec.engine", "specdec.model", "specdec.attention", "specdec.batch",
          "specdec.kv_cache", "specdec.weights", "specdec.graphs", "specdec.sampling",
          "specdec.verify", "specdec.transfer", "specdec.config", "specdec.invariant",
          "specdec.invariant_gemm", "specdec.invariant_attention", "specdec.triton_kernels",
          "specdec.gpu_pointwise", "specdec.draft_steps", "specdec.memory", "specdec.cpu")
ABOVE_ENGINE = ("specdec.proposers", "specdec.ngram", "specdec.policy", "specdec.planner",
                "specdec.estimates", "specdec.loop", "specdec.local", "specdec.serving",
                "specdec.openai", "specdec.tune", "specdec.cli")


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


def test_the_engine_imports_nothing_above_it():
    graph = imports(PACKAGES)
    wrong = {m: sorted(d for d in deps if d.startswith(ABOVE_ENGINE))
             for m, deps in graph.items() if m.startswith(ENGINE)}
    assert {m: d for m, d in wrong.items() if d} == {}


@pytest.mark.parametrize("module", ["specdec.loop", "specdec_client"])
def test_the_loop_and_the_client_import_no_torch(module):
    """The loop speaks to a drafter and a verifier, whatever computes them; the client runs
    where torch is not installed."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
