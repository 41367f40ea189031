"""Which loops serve host arrays: compiled kernels (numba) or NumPy ufuncs.

``"auto"`` (the default, or ``GPUQ_HOST_KERNELS=auto``) uses the compiled
kernels of ``_host_kernels`` when numba imports, ufuncs otherwise. Both give
the same bits; the compiled loops read memory once instead of 4-5 times.
numba is imported on the first host call that needs it, never by ``import
gpuq``.
"""

from __future__ import annotations

import os
import threading

CHOICES = ("auto", "numba", "numpy")

_lock = threading.Lock()
_choice = None
_kernels = None  # the loaded _host_kernels module, or False when numba is missing


def _load():
    global _kernels
    with _lock:
        if _kernels is None:
            try:
                from . import _host_kernels
            except ImportError:
                _kernels = False
            else:
                _kernels = _host_kernels
    return _kernels


def available() -> bool:
    """Whether the compiled kernels can load here (numba imports)."""
    return bool(_load())


def _validated(name, argname):
    if not isinstance(name, str) or name.lower() not in CHOICES:
        raise ValueError(f"{argname} must be one of {', '.join(CHOICES)}, got {name!r}")
    name = name.lower()
    if name == "numba" and not available():
        raise ValueError(f"{argname}='numba' needs numba: pip install 'gpuq[fast]'")
    return name


def kernels():
    """The compiled kernel module when it serves host arrays now, else None."""
    global _choice
    if _choice is None:
        _choice = _validated(os.environ.get("GPUQ_HOST_KERNELS", "auto"), "GPUQ_HOST_KERNELS")
    if _choice == "numpy":
        return None
    return _load() or None


def get_host_kernels() -> str:
    """What runs host (NumPy) arrays: ``"numba"`` (compiled loops) or ``"numpy"`` (ufuncs).

    >>> import gpuq
    >>> gpuq.get_host_kernels() in ("numba", "numpy")
    True
    """
    return "numba" if kernels() is not None else "numpy"


def set_host_kernels(name: str) -> None:
    """Choose the host loops: ``"auto"`` (numba if installed), ``"numba"`` or ``"numpy"``.

    The results are the same bits either way; only the speed differs.

    >>> import gpuq
    >>> gpuq.set_host_kernels("numpy"); gpuq.get_host_kernels()
    'numpy'
    >>> gpuq.set_host_kernels("auto")
    """
    global _choice
    _choice = _validated(name, "name")
