"""Which loops serve host arrays: compiled kernels (numba) or NumPy ufuncs.

``"auto"`` (the default, or ``GPUQ_HOST_KERNELS=auto``) uses the compiled
kernels of ``loops`` when they load, ufuncs otherwise. Both give the
same bits; the compiled loops read memory once instead of 4-5 times. numba is
imported on the first host call that needs it, never by ``import gpuq``. The
choice is process-wide and read once per call (a call in flight keeps its
loops).
"""

from __future__ import annotations

import os
import threading
import warnings

CHOICES = ("auto", "numba", "numpy")

_lock = threading.Lock()
_choice = None  # "auto", "numba" or "numpy"; None: not read from the environment yet
_kernels = None  # the loaded _host_kernels module, or False when it cannot load


def _import_kernels():
    from . import loops

    return loops


def _load():
    global _kernels
    if _kernels is None:
        with _lock:
            if _kernels is None:
                try:
                    _kernels = _import_kernels()
                except ImportError:
                    _kernels = False  # numba is not installed: the ufunc loops, quietly
                except Exception as exc:  # e.g. numba's cache has nowhere to go
                    _kernels = False
                    warnings.warn(f"gpuq: the compiled host kernels did not load "
                                  f"({type(exc).__name__}: {exc}); host arrays use NumPy ufuncs",
                                  RuntimeWarning, stacklevel=3)
    return _kernels


def available() -> bool:
    """Whether the compiled kernels load here (numba imports and compiles)."""
    return bool(_load())


def _validated(name, argname):
    if not isinstance(name, str) or name.lower() not in CHOICES:
        raise ValueError(f"{argname} must be one of {', '.join(CHOICES)}, got {name!r}")
    name = name.lower()
    if name == "numba" and not available():
        raise ValueError(f"{argname}='numba' needs numba: pip install 'gpuq[fast]'")
    return name


def _current_choice() -> str:
    global _choice
    if _choice is None:
        _choice = _validated(os.environ.get("GPUQ_HOST_KERNELS") or "auto", "GPUQ_HOST_KERNELS")
    return _choice


def kernels():
    """The compiled kernel module when it serves host arrays now, else None."""
    if _current_choice() == "numpy":
        return None
    return _load() or None


def get_host_kernels() -> str:
    """What runs host (NumPy) arrays: ``"numba"`` (compiled loops) or ``"numpy"`` (ufuncs).

    >>> import gpuq
    >>> gpuq.get_host_kernels() in ("numba", "numpy")
    True
    """
    return "numba" if kernels() is not None else "numpy"


def set_host_kernels(name: str) -> str:
    """Choose the host loops, process-wide: ``"auto"`` (numba if it loads), ``"numba"`` or
    ``"numpy"``. Returns the previous choice, to restore it with.

    The results are the same bits either way; only the speed differs. The
    initial choice comes from ``GPUQ_HOST_KERNELS`` (unset or empty: ``auto``).

    >>> import gpuq
    >>> before = gpuq.set_host_kernels("numpy")
    >>> gpuq.get_host_kernels()
    'numpy'
    >>> gpuq.set_host_kernels(before)
    'numpy'
    """
    global _choice
    name = _validated(name, "name")
    previous, _choice = _current_choice(), name
    return previous
