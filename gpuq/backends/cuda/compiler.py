"""Compile gpuq's CUDA sources with CuPy on first use, and cache the result.

CuPy is imported inside the functions, never at import time. A module is
compiled once per (source, name expressions, options, device architecture)
in a process (:func:`functools.cache`), and CuPy's on-disk kernel cache makes
the next process fast. Any op family registered in
:data:`gpuq.backends.registry.SOURCES` uses the same two calls:

>>> from gpuq.backends.cuda import compiler, registry      # doctest: +SKIP
>>> names = registry.quantize_group("float32", "int8")      # doctest: +SKIP
>>> fn = compiler.get_function("quantize.cu", names, names[0])  # doctest: +SKIP
>>> fn((blocks,), (256,), args, stream=cupy.cuda.get_current_stream())  # doctest: +SKIP
"""

from __future__ import annotations

import functools

from . import registry


def load_module(source_name: str, name_expressions):
    """The ``cupy.RawModule`` of ``kernels/<source_name>`` for the current device.

    ``name_expressions`` are the template instantiations to compile (names
    from :mod:`gpuq.backends.cuda.registry`); compile options are
    :data:`gpuq.backends.registry.OPTIONS`. Compilation happens at the first
    ``get_function`` and is cached.
    """
    import cupy

    arch = cupy.cuda.Device().compute_capability
    return _module(source_name, tuple(name_expressions), tuple(registry.OPTIONS), arch)


@functools.cache
def prepare_nvrtc() -> tuple:
    """Load NVRTC's builtins library beside the libnvrtc CuPy compiles with, once per process,
    before the first compile; returns the paths loaded (empty where none was needed or found).

    libnvrtc opens ``libnvrtc-builtins.so.<major>.<minor>`` by name at its first compile and
    finds it through its own run path; some wheels (torch's ``nvidia-cuda-nvrtc`` 13.0) have
    none, so CuPy's first compile, of gpuq's kernels or of CuPy's own, fails with "failed to
    open libnvrtc-builtins". Loaded first, the library is found by its soname. CuPy's libnvrtc
    is found in this process's mappings once CuPy has loaded it (asking its version loads it
    and compiles nothing); where that is not possible, beside the libnvrtc
    :func:`~gpuq.backends.cuda.nvrtc_check.find_libnvrtc` finds.

    >>> isinstance(prepare_nvrtc(), tuple)                  # doctest: +SKIP
    True
    """
    from . import nvrtc_check

    libs = []
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
        libs = _mapped_libraries("libnvrtc.so")
    except Exception:  # noqa: BLE001 - no CuPy NVRTC binding here (the CPU execution): the fallback
        pass
    if not libs:
        found = nvrtc_check.find_libnvrtc()
        libs = [found] if found is not None else []
    loaded = []
    for lib in libs:
        try:
            loaded += nvrtc_check.preload_builtins(lib)
        except OSError:  # a builtins library that does not load: NVRTC's own error will say more
            pass
    return tuple(loaded)


def _mapped_libraries(prefix: str) -> list:
    """Paths of the shared libraries mapped into this process whose file name starts with
    ``prefix`` (Linux's /proc/self/maps; empty elsewhere)."""
    from pathlib import Path

    try:
        with open("/proc/self/maps") as maps:
            fields = [line.split(None, 5) for line in maps]
    except OSError:
        return []
    paths = {f[5].strip() for f in fields if len(f) == 6}
    return sorted(Path(p) for p in paths if Path(p).name.startswith(prefix))


@functools.cache
def _module(source_name, names, options, arch):
    import cupy

    prepare_nvrtc()  # before the first compile (see prepare_nvrtc)
    return cupy.RawModule(code=registry.source_text(source_name), options=options,
                          name_expressions=list(names))


def get_function(source_name: str, name_expressions, name: str):
    """The kernel ``name`` (one of ``name_expressions``) on the current device, cached."""
    import cupy

    return _function(source_name, tuple(name_expressions), name, cupy.cuda.Device().id)


@functools.cache
def _function(source_name, names, name, device_id):
    # The device id is part of the key: a loaded function belongs to one device.
    return load_module(source_name, names).get_function(name)
