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
    ("gpuq.checkpoints",),
    ("gpuq", "gpuq.api", "gpuq.ops", "gpuq.qparams"),
    ("gpuq._params", "gpuq._qoptions", "gpuq._interop", "gpuq._dask", "gpuq._dispatch", "gpuq._mx",
     "gpuq._nvfp4"),
    ("gpuq.backends",),
    ("gpuq._codes",),
    ("gpuq._codetypes",),
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


# ---------------------------------------------------------------------------------------------
# One table of code types, one Backend protocol (issue 27)

#: What a branch on a format would compare with: code dtype names, short names and kinds.
_FORMAT_WORDS = {"int8", "uint8", "int4", "uint4", "float8_e4m3fn", "float8_e5m2", "fp8", "s4", "u4",
                 "f8_e4m3", "f8_e5m2", "e4m3fn", "e5m2"}
#: Where knowledge of the formats and backends lives: the table and the backends themselves.
_FORMAT_HOMES = ("gpuq._codetypes", "gpuq.backends")


def _strings(node):
    """The string constants of an expression (a constant, or a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    return set()


def format_branches(path: Path) -> list:
    """``line: source`` of every comparison of a value with a format's or backend's name, and of
    every ``.kind`` / ``.name`` of a code or backend compared with a string, in one file."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        words = set().union(*(_strings(s) for s in sides))
        named = any(isinstance(s, ast.Attribute) and s.attr in ("kind", "name") and
                    isinstance(s.value, ast.Name) and s.value.id in ("backend", "code", "fmt", "qdtype")
                    for s in sides)
        if words & _FORMAT_WORDS or (named and words):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_layer_outside_the_backends_branches_on_a_format_or_a_backend():
    bad = {name: hits for name, path in _modules().items()
           if not name.startswith(_FORMAT_HOMES) and (hits := format_branches(path))}
    assert bad == {}


def test_the_format_check_sees_branches(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('if code.kind == "fp8": pass\nif dt in ("int4", "uint4"): pass\n'
                    'if backend.name == "numpy": pass\nif code.storage == "packed": pass\n')
    assert [h.split(":")[0] for h in format_branches(path)] == ["1", "2", "3"]


def private_imports(root: Path = ROOT / "backends") -> list:
    """``module: name`` of every private name a module of ``root`` takes from another module of
    the package (``from .x import _y``, or ``x._y`` where ``x`` is an imported module)."""
    modules = _modules(root.parent)
    found = []
    for name, path in modules.items():
        if not name.startswith("gpuq.backends"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        found.append(f"{name}: {a.name}")
                    aliases[a.asname or a.name] = a.name
            elif isinstance(node, ast.Import):
                for a in node.names:
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__") and not aliases[node.value.id].startswith(("numpy", "cupy"))):
                found.append(f"{name}: {node.value.id}.{node.attr}")
    return sorted(set(found))


def test_the_backends_share_no_private_names():
    assert private_imports() == []


def test_both_backends_implement_the_protocol_with_its_signatures():
    import inspect

    from gpuq.backends.cuda.backend import CudaBackend
    from gpuq.backends.host.backend import NumpyBackend
    from gpuq.backends.protocol import Backend

    wanted = {n: v for n, v in vars(Backend).items() if not n.startswith("_")}
    assert len(wanted) == 16
    attributes = set(Backend.__annotations__)
    assert attributes == {"name", "arrays"}
    for backend in (NumpyBackend, CudaBackend):
        assert all(isinstance(getattr(backend, a), str) for a in attributes)
        for name, member in wanted.items():
            got = inspect.getattr_static(backend, name, None)
            assert isinstance(got, staticmethod), f"{backend.__name__}.{name}: not a static method"
            assert inspect.signature(got.__func__).parameters.keys() == \
                inspect.signature(member.__func__).parameters.keys(), f"{backend.__name__}.{name}"
        extra = {n for n in vars(backend) if not n.startswith("_")} - set(wanted) - attributes
        assert extra == set(), f"{backend.__name__} has methods outside the protocol: {extra}"


# ---------------------------------------------------------------------------------------------
# The checkpoint engine below the command (issue 36)

#: What a branch on a checkpoint format would compare with: the --format names, config.json's
#: quant_method and format values, and inspect's "dense".
_CHECKPOINT_WORDS = {"gpuq", "compressed-tensors", "fp8-blocks", "fp8", "pack-quantized",
                     "naive-quantized", "float-quantized", "int-quantized", "dense", "gpt-oss-mxfp4", "mxfp4"}
#: Where checkpoint formats are known: their modules.
_CHECKPOINT_FORMAT_HOMES = ("gpuq.checkpoints.formats",)


def checkpoint_format_branches(path: Path) -> list:
    """``line: source`` of every comparison of a value with a checkpoint format's name in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        words = set().union(*(_strings(s) for s in sides))
        if words & _CHECKPOINT_WORDS:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_formats_branches_on_a_checkpoint_format():
    bad = {name: hits for name, path in _modules().items()
           if name.startswith("gpuq.") and not name.startswith(_CHECKPOINT_FORMAT_HOMES)
           and (hits := checkpoint_format_branches(path))}
    assert bad == {}


def test_the_checkpoint_format_check_sees_branches(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('if args.format != "gpuq": pass\nif fmt in ("x", "y"): pass\n'
                    'if quant_method == "fp8": pass\nif args.dtype == "int8": pass\n'
                    'if what in {"dense", "gpuq"}: pass\n')
    assert [h.split(":")[0] for h in checkpoint_format_branches(path)] == ["1", "3", "5"]


def test_the_checkpoint_engine_never_imports_the_command():
    bad = [f"{a} -> {b}" for a, edges in import_graph().items() for b in sorted(edges)
           if a.startswith("gpuq.checkpoints") and (b == "gpuq.cli" or b.startswith("gpuq.cli."))]
    assert bad == []


def test_the_command_is_a_thin_shell():
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "cli").rglob("*.py"))
    assert lines <= 1500, f"gpuq/cli/**/*.py has {lines} lines; the engine belongs in gpuq.checkpoints"


def test_every_format_module_implements_the_protocol():
    import inspect

    from gpuq.checkpoints.formats import FORMATS, Format

    wanted = {n: v for n, v in vars(Format).items() if not n.startswith("_") and callable(v)}
    assert set(wanted) == {"reads", "check", "quantize", "dequantize", "describe"}
    for key, module in FORMATS.items():
        assert module.name == key
        for n, member in wanted.items():
            got = getattr(module, n)
            assert list(inspect.signature(got).parameters) == \
                list(inspect.signature(member).parameters)[1:], f"{module.__name__}.{n}"


def test_every_serving_format_module_implements_its_hooks():
    """A model-folder format is its module: the hooks the folder layer calls, and the layouts
    that store one weight, defined there (adding one is a module and a registry row)."""
    import inspect

    from gpuq.checkpoints.formats import FORMATS
    from gpuq.checkpoints.formats._serving import ServingFormat
    from gpuq.checkpoints.serving.formats import Layout

    wanted = {n: v for n, v in vars(ServingFormat).items() if not n.startswith("_") and callable(v)}
    assert set(wanted) == {"request", "scale_dtype", "config", "column_notes", "load_notes", "read_folder"}
    folders = [m for m in FORMATS.values() if hasattr(m, "QUANT_METHOD")]
    assert len(folders) == 3 and len({m.QUANT_METHOD for m in folders}) == len(folders)
    # gpt-oss's MXFP4 writes its expert tensors with a run of its own (no Linear weights), and
    # reads through the folder layer with its read_folder and layout
    serving = [m for m in folders if hasattr(m, "request")]
    assert len(serving) == 2
    for module in folders:
        assert isinstance(module.QUANT_METHOD, str) and isinstance(module.IGNORE_KEY, str)
        for n, member in wanted.items():
            if module in serving or n == "read_folder":
                assert list(inspect.signature(getattr(module, n)).parameters) == \
                    list(inspect.signature(member).parameters)[1:], f"{module.__name__}.{n}"
        layouts = [v for v in vars(module).values() if isinstance(v, Layout)]
        assert layouts and all(type(v).__module__ == module.__name__ for v in layouts), module.__name__


def test_the_folder_layer_holds_no_format_of_its_own():
    """No Layout subclass, and no serving format's name, quant_method or layout name as a value,
    in gpuq.checkpoints.serving (its report names gpuq's own files "gpuq")."""
    bad = {}
    for name, path in _modules().items():
        if not name.startswith("gpuq.checkpoints.serving"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        hits = [f"{n.lineno}: {n.value!r}" for n in ast.walk(tree) if isinstance(n, ast.Constant)
                and id(n) not in docs and n.value in _CHECKPOINT_WORDS - {"dense", "gpuq"}]
        hits += [f"{n.lineno}: class {n.name}" for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                 and any(isinstance(b, ast.Name) and b.id == "Layout" for b in n.bases)]
        if hits:
            bad[name] = hits
    assert bad == {}


def signal_handler_calls(path: Path) -> list:
    """``line: source`` of every ``signal.signal(...)``/``signal.set_wakeup_fd`` call in one file."""
    return [f"{n.lineno}: {ast.unparse(n)}" for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("signal", "set_wakeup_fd") and isinstance(n.func.value, ast.Name)
            and n.func.value.id in ("signal", "_signal")]


def test_the_checkpoint_engine_installs_no_signal_handler():
    bad = {name: hits for name, path in _modules().items()
           if name.startswith("gpuq.checkpoints") and (hits := signal_handler_calls(path))}
    assert bad == {}
    assert signal_handler_calls(ROOT / "cli" / "signals.py")  # the check sees the command's
