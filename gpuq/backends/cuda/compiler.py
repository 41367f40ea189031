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
def _module(source_name, names, options, arch):
    import cupy

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
