"""Compile every registered kernel instantiation with NVRTC, no GPU and no CuPy needed.

Drives ``libnvrtc`` through :mod:`ctypes`, taken from the ``nvidia-cuda-nvrtc``
wheel (``site-packages/nvidia/cu13/lib`` for CUDA 13, ``nvidia/cuda_nvrtc/lib``
for CUDA 12), ``$GPUQ_NVRTC`` or the system library path. NVRTC compiles
without a driver, so CI checks the kernels on machines without a GPU.

For each source in :data:`gpuq.backends.cuda.registry.SOURCES` it compiles the
expanded source with every name expression, with the contract's options, for
PTX (``compute_80``) and SASS (``sm_80``, ``sm_90``). Any error or warning (any
text in NVRTC's log) is a failure. It also compiles ``compute_80`` PTX with
``-ftz=true`` (what CuPy appends) and demands the same PTX: the kernels'
results must not depend on the flush-to-zero flag.

Command line: ``python -m gpuq.backends.cuda.nvrtc_check`` (exit status 1 on failure).

>>> find_libnvrtc() is None or find_libnvrtc().name.startswith("libnvrtc")
True
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import registry

#: Targets checked: PTX for the oldest supported architecture, SASS for A100 and H100.
TARGETS = ("compute_80", "sm_80", "sm_90")


@dataclass
class Result:
    """One NVRTC compile: ``ok`` is False on an error or any log text."""

    source: str
    target: str
    options: tuple
    names: list
    rc: int
    log: str
    code: bytes = b""
    lowered: dict = field(default_factory=dict)
    overridden: bool = False  # compile_as_cupy: NVRTC reported CuPy's -ftz=true override

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.log.strip()

    def describe(self) -> str:
        status = "ok" if self.ok else f"FAILED (nvrtc result {self.rc})"
        text = f"{self.source} [{self.target}] {len(self.names)} kernels: {status}"
        return text + (f"\n{self.log.rstrip()}" if self.log.strip() else "")


def find_libnvrtc() -> Path | None:
    """The path of libnvrtc (CUDA 13 or 12), or None when none can be found."""
    env = os.environ.get("GPUQ_NVRTC")
    if env and Path(env).is_file():
        return Path(env)
    roots = []
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        roots += [Path(p) for p in nvidia.__path__]
    except ImportError:
        pass
    for root in roots:
        for sub in ("cu13/lib", "cuda_nvrtc/lib", "cu12/lib"):
            hits = sorted(glob.glob(str(root / sub / "libnvrtc.so*")))
            hits = [h for h in hits if "builtins" not in h]
            if hits:
                return Path(hits[0])
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) + [
        os.environ.get("CUDA_PATH", "/usr/local/cuda") + "/lib64"
    ]:
        if d:
            hits = [h for h in sorted(glob.glob(os.path.join(d, "libnvrtc.so*"))) if "builtins" not in h]
            if hits:
                return Path(hits[0])
    return None


def preload_builtins(libnvrtc: Path) -> list:
    """Load the ``libnvrtc-builtins.so*`` beside ``libnvrtc``, before it; returns their paths.

    libnvrtc opens its builtins library by name at the first compile, and finds
    it through its own run path. torch's ``nvidia-cuda-nvrtc`` 13.0 wheel has no
    ``$ORIGIN`` run path, so every compile fails with ``failed to open
    libnvrtc-builtins.so.13.0``; once loaded, the library is found by its soname.
    """
    loaded = []
    for hit in sorted(glob.glob(str(Path(libnvrtc).parent / "libnvrtc-builtins.so*"))):
        ctypes.CDLL(hit, mode=ctypes.RTLD_GLOBAL)
        loaded.append(Path(hit))
    return loaded


class Nvrtc:
    """A thin ctypes binding of the NVRTC calls the check needs.

    >>> lib = find_libnvrtc()
    >>> lib is None or Nvrtc(lib).version() >= (12, 0)
    True
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.builtins = preload_builtins(self.path)
        self.lib = lib = ctypes.CDLL(str(path))
        p = ctypes.c_void_p
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(p), ctypes.c_char_p, ctypes.c_char_p,
                                           ctypes.c_int, p, p]
        lib.nvrtcAddNameExpression.argtypes = [p, ctypes.c_char_p]
        lib.nvrtcCompileProgram.argtypes = [p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcGetProgramLogSize.argtypes = [p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetProgramLog.argtypes = [p, ctypes.c_char_p]
        lib.nvrtcGetLoweredName.argtypes = [p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(p)]
        for fn in ("PTX", "CUBIN"):
            getattr(lib, f"nvrtcGet{fn}Size").argtypes = [p, ctypes.POINTER(ctypes.c_size_t)]
            getattr(lib, f"nvrtcGet{fn}").argtypes = [p, ctypes.c_char_p]

    def version(self) -> tuple:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return major.value, minor.value

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, source: str, filename: str, options, names=()) -> tuple:
        """Compile; returns ``(rc, log, code, lowered names)``. ``code`` is PTX
        for a ``compute_XY`` target and a cubin for ``sm_XY``."""
        lib = self.lib
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(),
                                           0, None, None), "nvrtcCreateProgram")
        try:
            for n in names:
                self._check(lib.nvrtcAddNameExpression(prog, n.encode()), "nvrtcAddNameExpression")
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            code, lowered = b"", {}
            if rc == 0:
                kind = "CUBIN" if any(o.startswith("--gpu-architecture=sm_") for o in options) else "PTX"
                self._check(getattr(lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), "size")
                out = ctypes.create_string_buffer(size.value)
                self._check(getattr(lib, f"nvrtcGet{kind}")(prog, out), "get code")
                code = out.raw
                for n in names:
                    ptr = ctypes.c_char_p()
                    self._check(lib.nvrtcGetLoweredName(prog, n.encode(), ctypes.byref(ptr)),
                                "nvrtcGetLoweredName")
                    lowered[n] = ptr.value.decode()
            return rc, log, code, lowered
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_source(nvrtc: Nvrtc, source: str, target: str, extra=(), names=None) -> Result:
    """Compile one registered source for one target with the contract's options."""
    names = list(registry.SOURCES[source]() if names is None else names)
    options = (f"--gpu-architecture={target}",) + tuple(registry.OPTIONS) + tuple(extra)
    rc, log, code, lowered = nvrtc.compile(registry.source_text(source), source, options, names)
    return Result(source, target, options, names, rc, log, code, lowered)


#: CuPy 14 appends these after the caller's options (cupy/cuda/compiler.py:
#: ``_compile_with_cache_cuda`` adds ``-ftz=true``; the NVRTC compile adds
#: ``-arch=sm_XX`` for a cubin and ``--device-as-default-execution-space``).
#: Its include paths (CCCL, CuPy's and CUDA's headers) come first and are left
#: out here: the kernels include nothing.
CUPY_APPENDS = ("-ftz=true", "-arch=sm_{arch}", "--device-as-default-execution-space")

#: The one line NVRTC prints for CuPy's option list: the contract's ``-ftz=false``
#: overridden by CuPy's ``-ftz=true`` (harmless: see kernels/contract.cuh and
#: :func:`ftz_independent`). Any other log line is a failure.
FTZ_OVERRIDE = re.compile(r'^nvrtc: warning: "--ftz\(-ftz\)=false" followed by "--ftz\(-ftz\)=true"$')


def compile_as_cupy(nvrtc: Nvrtc, source: str, arch: str, names=None) -> Result:
    """Compile ``source`` with the option list ``cupy.RawModule`` really passes for
    compute capability ``arch`` (e.g. ``"90"``): the contract's options, then CuPy's;
    ``names`` (default: every instantiation of ``source``) the name expressions to compile.

    ``ok`` unless NVRTC fails or logs anything besides :data:`FTZ_OVERRIDE`;
    ``overridden`` says whether that known line was there.
    """
    names = list(registry.SOURCES[source]() if names is None else names)
    options = tuple(registry.OPTIONS) + tuple(o.format(arch=arch) for o in CUPY_APPENDS)
    rc, log, code, lowered = nvrtc.compile(registry.source_text(source), source, options, names)
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    rest = [line for line in lines if not FTZ_OVERRIDE.match(line)]
    return Result(source, f"cupy sm_{arch}", options, names, rc, "\n".join(rest), code, lowered,
                  overridden=len(rest) < len(lines))


def ftz_independent(nvrtc: Nvrtc, source: str, base: Result | None = None, target: str = "compute_80",
                    names=None) -> Result:
    """Compile PTX for ``target`` with ``-ftz=true`` in place of ``-ftz=false``; ``ok`` only if it
    is identical. ``compute_90`` covers the sm_89+ branches (``#if __CUDA_ARCH__ >= 890``).

    ``base`` may pass in the ``target`` result of :func:`compile_source`; ``names`` (default: every
    instantiation of ``source``) the name expressions to compile.
    """
    names = list(registry.SOURCES[source]() if names is None else names)
    if base is None:
        base = compile_source(nvrtc, source, target, names=names)
    opts = tuple(o for o in registry.OPTIONS if not o.startswith("-ftz"))
    rc, log, code, _ = nvrtc.compile(registry.source_text(source), source,
                                     (f"--gpu-architecture={target}",) + opts + ("-ftz=true",), names)
    res = Result(source, f"{target} -ftz=true", opts + ("-ftz=true",), names, rc, log, code)
    a, b = _normalise_ptx(base.code), _normalise_ptx(code)
    if rc == 0 and base.rc == 0 and a != b:
        diff = _first_diff(a, b)
        res.log += f"PTX differs from the -ftz=false build (kernels depend on flush-to-zero):\n{diff}\n"
    return res


def ftz_independent_of(base: Result, cupy: Result) -> Result:
    r"""The flush-to-zero check from two builds the check makes anyway: ``base``, the
    ``compute_80`` PTX of :func:`compile_source` (``-ftz=false``), and ``cupy``, the
    :func:`compile_as_cupy` build for ``"80"`` (``-ftz=true`` last; an ``-arch=sm_80`` build
    hands out its PTX, the text of a ``compute_80`` build). ``ok`` only if the two are the same
    line for line, but for what CuPy's ``--device-as-default-execution-space`` adds: a
    namespace-scope variable without an execution space becomes a ``.global`` of the PTX
    (with its value, if any) that no instruction reads (its uses are constant-folded); such
    an unread declaration in either build alone is set aside.

    >>> r = lambda code: Result("k.cu", "t", (), [], 0, "", code)
    >>> ftz_independent_of(r(b".global .u32 a = 1;\nadd.f32 %f1;"),
    ...                    r(b".global .u32 a = 1;\n.global .align 1 .u8 b = 1;\nadd.f32 %f1;")).ok
    True
    >>> ftz_independent_of(r(b".global .align 4 .u32 k = 2;\nadd.f32 %f1;"), r(b"add.f32 %f1;")).ok
    True
    >>> ftz_independent_of(r(b"add.f32 %f1;"), r(b"add.ftz.f32 %f1;")).ok
    False
    >>> ftz_independent_of(r(b"ld.global.u8 %r1, [b];"), r(b".global .u8 b;\nld.global.u8 %r1, [b];")).ok
    False
    """
    a, b = _normalise_ptx(base.code).splitlines(), _normalise_ptx(cupy.code).splitlines()
    # Unread global declarations in one build and not the other are set aside on both sides
    # (a namespace-scope constant was seen declared in the -ftz=false build alone in one CI run).
    in_a, in_b = set(a), set(b)
    only_a = {ln for ln in a if ln not in in_b and _DECLARED.match(ln)}
    added = {ln for ln in b if ln not in in_a and _DECLARED.match(ln)}
    a = [ln for ln in a if ln not in only_a]
    kept = [ln for ln in b if ln not in added]
    body = "\n".join(kept)
    read = [ln for ln in sorted(added | only_a) if re.search(rf"\b{re.escape(_DECLARED.match(ln).group(1))}\b", body)]
    opts = tuple(o for o in registry.OPTIONS if not o.startswith("-ftz")) + ("-ftz=true",)
    res = Result(base.source, "compute_80 -ftz=true (CuPy's sm_80 build)", opts, base.names,
                 base.rc or cupy.rc, "", cupy.code)
    if res.rc == 0 and (kept != a or read):
        where = _first_diff("\n".join(a), body) if kept != a else f"an added global is read: {read[0]}"
        res.log = f"PTX differs from the -ftz=false build (kernels depend on flush-to-zero):\n{where}\n"
    return res


#: A global's declaration (its value, if any, a constant): what --device-as-default-execution-space
#: may add.
_DECLARED = re.compile(r"^\s*\.global\s+(?:\.align\s+\d+\s+)?\.\w+\s+([\w$]+)(?:\[\d*\])?(?:\s*=\s*[^;]+)?;$")


# Internal-linkage symbols carry a hash of the compile options, e.g.
# _ZN50_INTERNAL_00000000_13_dequantize_cu_0fa44c28_145954gpuq5kUnitE.
_INTERNAL_HASH = re.compile(r"(_INTERNAL_[0-9a-f]+_\d+_\w+?_)[0-9a-f]{8}_\d+")


def _normalise_ptx(code: bytes) -> str:
    return _INTERNAL_HASH.sub(r"\1", code.decode(errors="replace"))


def _first_diff(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            return f"line {i + 1}:\n  -ftz=false: {x.strip()}\n  -ftz=true:  {y.strip()}"
    return "(lengths differ)"


def check_all(nvrtc: Nvrtc | None = None, targets=TARGETS) -> list:
    """Every registered source x target, plus the flush-to-zero independence check."""
    if nvrtc is None:
        path = find_libnvrtc()
        if path is None:
            raise FileNotFoundError("libnvrtc not found: pip install nvidia-cuda-nvrtc")
        nvrtc = Nvrtc(path)
    results = []
    for source in registry.SOURCES:
        done = {t: compile_source(nvrtc, source, t) for t in targets}
        results += list(done.values())
        results.append(ftz_independent(nvrtc, source, done.get("compute_80")))
        results.append(ftz_independent(nvrtc, source, target="compute_90"))
        results.append(compile_as_cupy(nvrtc, source, "90"))
    return results


def main(argv=None) -> int:
    path = find_libnvrtc()
    if path is None:
        print("libnvrtc not found: pip install nvidia-cuda-nvrtc", file=sys.stderr)
        return 1
    nvrtc = Nvrtc(path)
    print(f"NVRTC {'.'.join(map(str, nvrtc.version()))} from {path}")
    results = check_all(nvrtc)
    for r in results:
        print(r.describe())
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
