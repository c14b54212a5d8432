"""The engine's folders are layers: every import, read from the source, runs downward, and no files import
each other in a loop. The order is the one docs/architecture.md states at its top."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Packages, lowest first: each imports only the ones before it.
PACKAGES = ("dgemma", "remote", "nodes serve mcp_server", "runner")
# dgemma's layers, lowest first: a module imports the engine only from lower layers or its own folder.
LAYERS = ("paths", "errors versions readings", "inputs", "payloads", "loading", "constraints", "steps", "readouts",
          "denoising", "backend demo __init__")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path, known: set[str]) -> list[tuple[str, int]]:
    """(module, line) of every import of a module in `known`, at any depth of the file, resolved to the file."""
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        out += [(t, node.lineno) for t in dict.fromkeys(targets) if t in known]
    return out


def graph(root: Path, packages) -> dict[str, list[tuple[str, int]]]:
    files = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    return {name: imports(path, root, set(files)) for name, path in files.items()}


def unit(module: str) -> str:
    """A dgemma module's folder, or its own name for a file at the engine's top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer(module: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if unit(module) in names.split())


def upward(edges: dict) -> list[str]:
    """Every import that runs up or sideways: between packages, and between dgemma's layers."""
    rank = {pkg: i for i, names in enumerate(PACKAGES) for pkg in names.split()}
    out = []
    for a, targets in edges.items():
        for b, line in targets:
            pa, pb = a.split(".")[0], b.split(".")[0]
            if pa != pb and rank[pb] >= rank[pa]:
                out.append(f"{a}:{line} imports {b}: package {pb} is not below {pa}")
            elif pa == pb == "dgemma" and unit(a) != unit(b) and layer(b) >= layer(a):
                out.append(f"{a}:{line} imports {b}: {unit(b)} is not below {unit(a)}")
    return out


def cycles(edges: dict) -> list[list[str]]:
    """Strongly connected groups of more than one file (Tarjan), and files importing themselves."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on.discard(group[-1])
            if len(group) > 1 or any(w == v for w, _ in edges.get(v, ())):
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_import_runs_down():
    assert upward(graph(ROOT, [p for names in PACKAGES for p in names.split()])) == []


def test_no_files_import_each_other_in_a_loop():
    assert cycles(graph(ROOT, [p for names in PACKAGES for p in names.split()])) == []


def test_the_architecture_page_states_this_order():
    text = (ROOT / "docs/architecture.md").read_text()
    stated = re.search(r"^Layers, lowest first: (.+)$", text, re.M).group(1)
    written = [re.findall(r"`(\w+)", group) for group in stated.split(" → ")]
    assert written == [names.split() for names in LAYERS]


def test_an_import_up_or_a_loop_is_found(tmp_path):
    """The checks on a made-up engine: readouts importing denoising, and two denoising files importing each other."""
    for rel, text in {"dgemma/__init__.py": "", "dgemma/errors.py": "",
                      "dgemma/readouts/__init__.py": "", "dgemma/readouts/trace.py": "from ..denoising import loop\n",
                      "dgemma/denoising/__init__.py": "", "dgemma/denoising/loop.py": "from .run import go\n",
                      "dgemma/denoising/run.py": "def go():\n    from . import loop\n",
                      "remote/__init__.py": "", "remote/pack.py": "from ..dgemma.errors import X\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    edges = graph(tmp_path, ["dgemma", "remote"])
    assert upward(edges) == ["dgemma.readouts.trace:1 imports dgemma.denoising.loop: denoising is not below readouts"]
    assert cycles(edges) == [["dgemma.denoising.loop", "dgemma.denoising.run"]]


def test_shipped_code_imports_nothing_made_for_tests():
    shipped = [p for names in PACKAGES for p in names.split()]
    edges = graph(ROOT, [*shipped, "testing"])
    assert [f"{a}:{line} imports {b}" for a, targets in edges.items() if a.split(".")[0] != "testing"
            for b, line in targets if b.split(".")[0] == "testing"] == []
