"""Host build and execution of gpuq's CUDA kernels, for tests on machines without a GPU.

:func:`build` takes the text NVRTC would compile (``registry.source_text(name)``)
and the same name expressions, rewrites its inline PTX into host helpers
(:mod:`cudasim.ptx`), compiles it as C++17 with the system g++ against the
shim headers (``shim/``: the CUDA dialect, the PTX helpers, the fiber
runtime) into a shared library, caches that on disk, and loads it with
ctypes. Each name expression becomes a :class:`Kernel` whose parameter list
comes from C++ itself (the function pointer's type), and whose
:meth:`Kernel.launch` runs a grid synchronously: every CUDA thread is a fiber,
blocks one after another, under a reset floating-point environment.

>>> SCHEDULES
('inorder', 'reversed', 'interleaved')

Nothing is compiled at import. The disk cache lives in ``$GPUQ_CUDASIM_CACHE``
(default ``~/.cache/gpuq-cudasim``); its key hashes the generated C++ (source,
name expressions), the flags, the shim headers, these Python files and the
compiler's version. Builds write a temporary file and rename it, under a
file lock, so concurrent processes are safe.

``build(..., sanitize=True)`` adds UBSan with no recovery: undefined behaviour
then aborts the process, so run such code in a child with :func:`run_sanitized`.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import fcntl
import functools
import hashlib
import operator
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from . import ptx
from .source import (
    SourceError,
    dynamic_shared_edits,
    global_functions,
    replace_spans,
    tokenize,
)

#: Orders in which a block's fibers start and resume (see shim/cudasim_runtime.h).
SCHEDULES = ("inorder", "reversed", "interleaved")

SHIM_DIR = Path(__file__).resolve().parent / "shim"
TESTS_DIR = Path(__file__).resolve().parents[1]

#: g++ flags of every build: the contract's arithmetic (no contraction into
#: FMA, no fast-math), type punning through vector pointers tolerated as NVCC
#: does, device code cannot throw, only the C entry points exported.
FLAGS = ("-std=c++17", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing", "-fno-exceptions",
         "-fPIC", "-shared", "-fvisibility=hidden", "-U_FORTIFY_SOURCE", "-Wno-unknown-pragmas",
         "-Wno-class-memaccess", "-Wno-attributes")
#: Added by ``sanitize=True``; the static runtime lets ctypes load the library.
SANITIZE_FLAGS = ("-fsanitize=undefined", "-fno-sanitize-recover=undefined", "-static-libubsan")
#: Options of the sanitized child of :func:`run_sanitized`.
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"

_ERRLEN = 4096
_KINDS = {0: "pointer", 1: "int", 2: "uint", 3: "float", 4: "bool"}


class KernelFault(RuntimeError):
    """A launch did something a GPU would punish (bad configuration or
    arguments, misaligned vector access, partial barrier, a collective with a
    lane missing, a bad address, an assert...)."""


class BuildError(RuntimeError):
    """The host build failed (unknown asm, bad name expression, g++ error)."""


class Param(NamedTuple):
    """One kernel parameter: ``kind`` in pointer/int/uint/float/bool, ``size``
    in bytes, ``ctype`` as C++ spells it (``"const float*"``, ``"long long"``)."""

    kind: str
    size: int
    ctype: str


def kernel_registry():
    """gpuq's kernel registry (``source_text``, ``SOURCES``, the name builders).

    The one place this package imports it: ``gpuq.backends.cuda.registry``,
    or the module's name before the backends were split into subpackages.
    """
    try:
        from gpuq.backends.cuda import registry
    except ModuleNotFoundError as exc:
        if exc.name not in ("gpuq.backends.cuda", "gpuq.backends.cuda.registry"):
            raise
        from gpuq.backends import (
            _kernels as registry,  # the previous layout (to be removed)
        )
    return registry


def cache_dir() -> Path:
    """The on-disk cache of built libraries (created on first use)."""
    d = Path(os.environ.get("GPUQ_CUDASIM_CACHE") or Path.home() / ".cache" / "gpuq-cudasim")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _compiler() -> str:
    return os.environ.get("GPUQ_CUDASIM_CXX", "g++")


@functools.cache
def _compiler_identity(cxx: str) -> str:
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
        machine = subprocess.run([cxx, "-dumpmachine"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"the host build needs a C++17 g++ ({cxx!r}): {exc}") from exc
    return version.splitlines()[0] + " " + machine.strip()


def _tool_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(SHIM_DIR.glob("*.h")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    here = Path(__file__).resolve().parent
    for name in ("hostbuild.py", "ptx.py", "source.py"):
        h.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    return h.hexdigest()


# --- source to translation unit -------------------------------------------------------------------

def translate_source(text: str) -> str:
    """The kernel text g++ compiles: inline PTX rewritten (:func:`cudasim.ptx.translate`)
    and ``extern __shared__`` arrays pointed at the runtime's dynamic shared memory."""
    edits = [(s.start, s.end, ptx.translate_statement(s)) for s in ptx.find_asm(text)]
    edits += dynamic_shared_edits(text)
    return replace_spans(text, edits)


def _split_name(expr: str) -> tuple[str, str]:
    """``(namespace, function)`` of a name expression such as ``gpuq::quantize<float, ...>``."""
    toks = tokenize(expr)
    head = []
    for t in toks:
        if t.text == "<":
            break
        head.append(t)
    if head and head[0].text == "::":
        head = head[1:]
    if not head or len(head) % 2 == 0 or any(
            (t.kind != "ident") if i % 2 == 0 else (t.text != "::") for i, t in enumerate(head)):
        raise BuildError(f"cannot read the name expression {expr!r}")
    idents = [t.text for t in head[::2]]
    return "::".join(idents[:-1]), idents[-1]


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def generate(source_text: str, name_expressions: Sequence[str]) -> str:
    """The C++ translation unit of one module: the translated source, then the
    runtime and the entry table (one entry per name expression, in order)."""
    names = list(name_expressions)
    if not names:
        raise BuildError("no name expressions")
    if len(set(names)) != len(names):
        raise BuildError("duplicate name expressions")
    try:
        body = translate_source(source_text)
        decls = global_functions(body)
    except SourceError as exc:
        raise BuildError(str(exc)) from exc
    bounds_of: dict[str, set] = {}
    for d in decls:
        bounds_of.setdefault(d.name, set()).add(d.launch_bounds)
    out = ["// Generated by tests/cudasim/hostbuild.py: a CUDA source built for the host.",
           '#include "cudasim_dialect.h"', body, '#line 1 "<cudasim entries>"', '#include "cudasim_runtime.h"']
    rows = []
    for i, name in enumerate(names):
        namespace, func = _split_name(name)
        if func not in bounds_of:
            raise BuildError(f"{name!r} does not name a __global__ function of the source")
        bounds = bounds_of[func]
        if len(bounds) != 1:
            raise BuildError(f"the __global__ declarations of {func!r} disagree on __launch_bounds__: {sorted(map(str, bounds))}")
        (expr,) = bounds
        const = f"cudasim_launch_bounds_{i}"
        value = "1024" if expr is None else f"static_cast<long long>({expr})"
        decl = f"constexpr long long {const} = {value};"
        out.append(f"namespace {namespace} {{ {decl} }}" if namespace else decl)
        qualified = f"::{namespace}::{const}" if namespace else f"::{const}"
        out.append(f'static_assert({qualified} >= 1 && {qualified} <= 1024, '
                   f'"__launch_bounds__ of {func} outside [1, 1024]");')
        rows.append(f"    {{{_c_string(name)}, &::cudasim::Kernel<&{name}>::fill, {qualified}}},")
    out.append("static const ::cudasim::EntryMaker cudasim_entry_table[] = {")
    out.extend(rows)
    out.append("};")
    out.append("CUDASIM_DEFINE_EXPORTS(cudasim_entry_table)")
    return "\n".join(out) + "\n"


# --- compiling and caching -------------------------------------------------------------------------

def _flags(sanitize: bool, defines: Sequence[str]) -> tuple:
    for d in defines:
        if not d or d.startswith("-") or any(c.isspace() for c in d):
            raise BuildError(f"bad define {d!r}")
    return FLAGS + (SANITIZE_FLAGS if sanitize else ()) + tuple(f"-D{d}" for d in defines)


def _compile_cached(tu: str, flags: tuple) -> tuple[Path, float]:
    """The cached library of ``tu`` (compiled now if missing) and the seconds spent compiling."""
    cxx = _compiler()
    key = hashlib.sha256("\0".join(
        ["cudasim-1", _compiler_identity(cxx), " ".join(flags), _tool_hash(), tu]).encode()).hexdigest()[:32]
    d = cache_dir()
    lib = d / f"{key}.so"
    if lib.exists():
        return lib, 0.0
    with open(d / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
        if lib.exists():
            return lib, 0.0
        src = d / f"{key}.cpp"
        tmp_src = src.with_name(f"{src.name}.{os.getpid()}.tmp")
        tmp_src.write_text(tu)
        os.replace(tmp_src, src)
        fd, tmp_lib = tempfile.mkstemp(prefix=f"{key}.", suffix=".so.tmp", dir=d)
        os.close(fd)
        cmd = [cxx, *flags, "-I", str(SHIM_DIR), "-o", tmp_lib, str(src)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            os.unlink(tmp_lib)
            lines = proc.stderr.splitlines()
            tail = "\n".join(lines[:80]) + ("\n..." if len(lines) > 80 else "")
            raise BuildError(f"g++ failed ({' '.join(cmd)}):\n{tail}")
        os.replace(tmp_lib, lib)
    return lib, seconds


# --- modules and kernels -----------------------------------------------------------------------------

class _ParamDesc(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("size", ctypes.c_uint), ("align", ctypes.c_uint),
                ("offset", ctypes.c_uint), ("ctype", ctypes.c_char_p)]


class _EntryDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("nparams", ctypes.c_int), ("params", ctypes.POINTER(_ParamDesc)),
                ("argbuf_size", ctypes.c_uint), ("max_threads", ctypes.c_longlong), ("invoke", ctypes.c_void_p)]


# One launch at a time in this process: a launch installs process-wide signal
# handlers and the thread's alternate signal stack for its duration.
_LAUNCH_LOCK = threading.Lock()

_MAX_BLOCK = (1024, 1024, 64)
_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_DYNAMIC_SHARED = 227 * 1024  # the largest opt-in; the stand-in applies each kernel's own limit


def _dims(what: str, value) -> tuple[int, int, int]:
    if isinstance(value, (tuple, list)):
        items = list(value)
    else:
        items = [value]
    if not 1 <= len(items) <= 3:
        raise KernelFault(f"{what} must have 1 to 3 dimensions, got {value!r}")
    dims = []
    for v in items:
        if isinstance(v, bool):
            raise KernelFault(f"{what} dimension {v!r} is not an integer")
        try:
            dims.append(operator.index(v))
        except TypeError:
            raise KernelFault(f"{what} dimension {v!r} is not an integer") from None
    dims += [1] * (3 - len(dims))
    return dims[0], dims[1], dims[2]


class Kernel:
    """One kernel of a :class:`HostModule` (a name expression)."""

    def __init__(self, module: HostModule, index: int, desc: _EntryDesc):
        self._module = module
        self._index = index
        self.name: str = desc.name.decode()
        self.params: tuple[Param, ...] = tuple(
            Param(_KINDS[desc.params[i].kind], desc.params[i].size, desc.params[i].ctype.decode())
            for i in range(desc.nparams))
        self._offsets = tuple(desc.params[i].offset for i in range(desc.nparams))
        self._argbuf_size = desc.argbuf_size
        #: Threads per block allowed by the kernel's __launch_bounds__ (1024 without).
        self.max_threads: int = desc.max_threads

    def __repr__(self):
        return f"<cudasim Kernel {self.name}>"

    def launch(self, grid, block, args, shared_mem: int = 0, schedule: str = "inorder") -> None:
        """Run the grid synchronously. ``args``: the raw little-endian bytes of
        each parameter (pointers as 8-byte host addresses). Raises
        :class:`KernelFault` for a bad configuration or argument list and for
        anything the kernel does that a GPU would punish."""
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        g, b = _dims("grid", grid), _dims("block", block)
        for i, (v, hi) in enumerate(zip(g, _MAX_GRID)):
            if not 1 <= v <= hi:
                raise KernelFault(f"{self.name}: grid dimension {'xyz'[i]} = {v} outside [1, {hi}]")
        for i, (v, hi) in enumerate(zip(b, _MAX_BLOCK)):
            if not 1 <= v <= hi:
                raise KernelFault(f"{self.name}: block dimension {'xyz'[i]} = {v} outside [1, {hi}]")
        threads = b[0] * b[1] * b[2]
        if threads > 1024:
            raise KernelFault(f"{self.name}: {threads} threads per block, a block holds at most 1024")
        if threads > self.max_threads:
            raise KernelFault(f"{self.name}: {threads} threads per block exceed its __launch_bounds__ "
                              f"({self.max_threads})")
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, int) or \
                not 0 <= shared_mem <= _MAX_DYNAMIC_SHARED:
            raise KernelFault(f"{self.name}: dynamic shared memory {shared_mem!r} outside [0, {_MAX_DYNAMIC_SHARED}]")
        if not isinstance(args, (list, tuple)):
            raise TypeError(f"args must be a list of bytes, got {type(args).__name__}")
        if len(args) != len(self.params):
            raise KernelFault(f"{self.name} takes {len(self.params)} arguments, got {len(args)}")
        buf = bytearray(self._argbuf_size)
        for i, (a, p, off) in enumerate(zip(args, self.params, self._offsets)):
            if not isinstance(a, (bytes, bytearray, memoryview)):
                raise TypeError(f"argument {i} of {self.name} must be bytes, got {type(a).__name__}")
            raw = bytes(a)
            if len(raw) != p.size:
                raise KernelFault(f"{self.name}: argument {i} ({p.ctype}) is {len(raw)} bytes, "
                                  f"the parameter takes {p.size}")
            buf[off:off + p.size] = raw
        cbuf = (ctypes.c_ubyte * max(1, len(buf))).from_buffer_copy(bytes(buf) or b"\0")
        err = ctypes.create_string_buffer(_ERRLEN)
        lib = self._module._lib
        with _LAUNCH_LOCK:
            rc = lib.cudasim_launch(self._index, (ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), cbuf,
                                    len(buf), shared_mem, SCHEDULES.index(schedule), err, _ERRLEN)
        if rc != 0:
            raise KernelFault(err.value.decode(errors="replace"))


@dataclass
class HostModule:
    """A built module: its kernels by name expression.

    ``compile_seconds`` is 0.0 when the library came from the disk cache.
    """

    path: Path
    names: tuple[str, ...]
    sanitize: bool
    compile_seconds: float
    _lib: ctypes.CDLL
    _kernels: dict

    def kernel(self, name: str) -> Kernel:
        """The kernel of name expression ``name`` (exactly as given to :func:`build`)."""
        try:
            return self._kernels[name]
        except KeyError:
            raise KeyError(f"{name!r} is not one of this module's name expressions: {list(self.names)}") from None

    def stack_high_water(self) -> int:
        """Most bytes any fiber stack of this module has used so far (approximate)."""
        return int(self._lib.cudasim_stack_high_water())


def _load(path: Path, names: tuple, sanitize: bool, seconds: float) -> HostModule:
    lib = ctypes.CDLL(str(path))
    if lib.cudasim_abi_version() != 1:
        raise BuildError(f"{path}: unexpected cudasim ABI")
    lib.cudasim_entry.restype = ctypes.POINTER(_EntryDesc)
    lib.cudasim_entry.argtypes = [ctypes.c_int]
    lib.cudasim_launch.restype = ctypes.c_int
    lib.cudasim_launch.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                                   ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_int,
                                   ctypes.c_char_p, ctypes.c_ulonglong]
    lib.cudasim_stack_high_water.restype = ctypes.c_ulonglong
    lib.cudasim_get_mxcsr.restype = ctypes.c_uint
    lib.cudasim_set_mxcsr.argtypes = [ctypes.c_uint]
    module = HostModule(path, names, sanitize, seconds, lib, {})
    count = lib.cudasim_entry_count()
    if count != len(names):
        raise BuildError(f"{path}: {count} entries for {len(names)} name expressions")
    for i in range(count):
        k = Kernel(module, i, lib.cudasim_entry(i).contents)
        if k.name != names[i]:
            raise BuildError(f"{path}: entry {i} is {k.name!r}, expected {names[i]!r}")
        module._kernels[k.name] = k
    return module


_MODULES: dict = {}
_MODULES_LOCK = threading.Lock()
_KEY_LOCKS: dict = {}


def build(source_text: str, name_expressions: Sequence[str], *, sanitize: bool = False,
          defines: Sequence[str] = ()) -> HostModule:
    """Build (or fetch from the caches) the host module of ``source_text`` with
    the kernels ``name_expressions``. ``sanitize``: UBSan, aborting on the first
    undefined behaviour. ``defines``: extra ``NAME[=VALUE]`` macros (tests)."""
    names = tuple(name_expressions)
    if not isinstance(source_text, str) or any(not isinstance(n, str) for n in names):
        raise TypeError("build takes the source text and name expressions as strings")
    key = (hashlib.sha256(source_text.encode()).hexdigest(), names, bool(sanitize), tuple(defines))
    with _MODULES_LOCK:
        if key in _MODULES:
            return _MODULES[key]
        key_lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with key_lock:
        with _MODULES_LOCK:
            if key in _MODULES:
                return _MODULES[key]
        tu = generate(source_text, names)
        path, seconds = _compile_cached(tu, _flags(bool(sanitize), tuple(defines)))
        module = _load(path, names, bool(sanitize), seconds)
        with _MODULES_LOCK:
            _MODULES[key] = module
        return module


def build_many(specs: Sequence[tuple[str, Sequence[str]]], *, sanitize: bool = False,
               jobs: int | None = None) -> list[HostModule]:
    """:func:`build` of several ``(source_text, name_expressions)`` at once,
    compiled in parallel (``jobs`` processes, default the CPU count)."""
    jobs = jobs or os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(build, src, names, sanitize=sanitize) for src, names in specs]
        return [f.result() for f in futures]


def build_source(filename: str, names: Sequence[str] | None = None, *, sanitize: bool = False) -> HostModule:
    """The module of gpuq's ``kernels/<filename>`` with ``names`` (default: every
    name the dispatcher can request, ``registry.SOURCES[filename]()``)."""
    reg = kernel_registry()
    return build(reg.source_text(filename), list(names) if names is not None else reg.SOURCES[filename](),
                 sanitize=sanitize)


def build_all_sources(*, sanitize: bool = False, jobs: int | None = None) -> dict[str, HostModule]:
    """Every source of the registry with all its names, compiled in parallel."""
    reg = kernel_registry()
    files = list(reg.SOURCES)
    mods = build_many([(reg.source_text(f), reg.SOURCES[f]()) for f in files], sanitize=sanitize, jobs=jobs)
    return dict(zip(files, mods))


# --- test helpers ----------------------------------------------------------------------------------

_BITS_CTYPES = {"uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64}


@functools.cache
def build_ptx_helpers() -> ctypes.CDLL:
    """A library exporting every PTX helper as ``cudasim_ptx_<helper>`` over raw
    bits (unit tests of :data:`cudasim.ptx.FORMS`)."""
    path, _ = _compile_cached(ptx.helper_exports(), _flags(False, ()))
    lib = ctypes.CDLL(str(path))
    for form in ptx.FORMS.values():
        fn = getattr(lib, f"cudasim_ptx_{form.helper}")
        fn.restype = _BITS_CTYPES[ptx.REG_BITS[form.dst]]
        fn.argtypes = [_BITS_CTYPES[ptx.REG_BITS[c]] for c in form.srcs]
    return lib


def run_sanitized(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run Python ``code`` in a child process with ``UBSAN_OPTIONS`` set (UB
    aborts the child, not this process) and ``cudasim`` importable; the result
    has ``returncode``, ``stdout`` and ``stderr`` (text)."""
    env = dict(os.environ)
    env["UBSAN_OPTIONS"] = UBSAN_OPTIONS
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env, check=False,
                          cwd=str(TESTS_DIR.parent))
