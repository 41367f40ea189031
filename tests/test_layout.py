"""The package layout: imports point down the layers, and no module imports itself in a circle.

The import graph is read from the source (every ``import``/``from ... import``
anywhere in a module, inside functions included), not by importing: a circle
that closes through a deferred import is invisible to ``import`` in a fresh
interpreter until the deferred call runs, and then it may fail half-way
through a user's call.

Edges go to the module named (``from .a import b`` is an edge to ``a.b`` when
that is a module, else to ``a``). The implicit import of a module's parent
packages is not an edge: Python finishes a parent package before its children
run, and a package's ``__init__`` is its public face, not a layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gpuq"

#: Layers, top to bottom: a module may import its own layer or any lower one.
LAYERS = (
    ("gpuq.__main__",),
    ("gpuq.cli",),
    ("gpuq", "gpuq.api", "gpuq.ops", "gpuq.qparams"),
    ("gpuq._formats",),
    ("gpuq._params", "gpuq._interop", "gpuq._dask", "gpuq._dispatch"),
    ("gpuq.backends",),
    ("gpuq._codes",),
    ("gpuq._dtypes", "gpuq._scheme"),
)


def _modules(root: Path = ROOT) -> dict:
    """Module name -> path of every module under ``root`` (gpuq/)."""
    found = {}
    for path in root.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def import_graph(root: Path = ROOT) -> dict:
    """Module -> set of the package's modules it imports, read from the source."""
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        package = name if _is_package(path) else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _layer(module: str) -> int:
    best = None
    for rank, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (rank, len(p))
    assert best is not None, f"{module} is in no layer of LAYERS: add it there"
    return best[0]


def test_no_import_circles():
    graph = import_graph()
    assert len(graph) > 20 and "gpuq.backends.cuda.backend" in graph
    assert cycles(graph) == []


def test_imports_point_down_the_layers():
    bad = [f"{a} -> {b}" for a, edges in import_graph().items() for b in sorted(edges)
           if _layer(b) < _layer(a)]
    assert bad == []


def test_host_and_cuda_backends_are_independent():
    bad = [f"{a} -> {b}" for a, edges in import_graph().items() for b in edges
           for x, y in (("host", "cuda"), ("cuda", "host"))
           if a.startswith(f"gpuq.backends.{x}") and b.startswith(f"gpuq.backends.{y}")]
    assert bad == []


def test_every_package_says_what_it_holds_and_may_import():
    for name, path in _modules().items():
        if _is_package(path) and name not in ("gpuq.kernels",):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "May import" in doc or name == "gpuq", f"{path}: docstring lacks 'May import'"


@pytest.mark.parametrize("source, expected", [
    # The two circles this layout removed, rebuilt in miniature: the check must see both.
    ({"a": "from .b import f", "b": "def f():\n    from .a import g"}, [["x.a", "x.b"]]),
    ({"a": "from . import b", "b": "from . import c", "c": "import x.a"}, [["x.a", "x.b", "x.c"]]),
    ({"a": "from . import b", "b": "import numpy"}, []),
])
def test_the_circle_check_sees_deferred_imports(tmp_path, source, expected):
    pkg = tmp_path / "x"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for mod, text in source.items():
        (pkg / f"{mod}.py").write_text(text + "\n")
    assert cycles(import_graph(pkg)) == expected
