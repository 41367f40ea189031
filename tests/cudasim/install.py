"""Choose the CuPy the tests get: the real one when it sees a device, else the stand-in.

:func:`install` returns ``"real"`` when a real CuPy imports and reports at
least one device (the stand-in is then left out entirely), else puts
``tests/cudasim/fake`` first on ``sys.path``, imports the stand-in as
``cupy`` and returns ``"sim"``. Calling it again returns the same answer and
changes nothing. :func:`uninstall` undoes an installation made here (for a
test module that wants the stand-in only for itself). Nothing of gpuq
imports this; it is not in the wheel.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

FAKE_DIR = str(Path(__file__).resolve().parent / "fake")
_TESTS_DIR = str(Path(__file__).resolve().parent.parent)
_MARK = "_gpuq_cudasim_installed"  # set on the stand-in module by install()


def _is_stand_in(mod) -> bool:
    file = getattr(mod, "__file__", None)
    return mod is not None and hasattr(mod, "_sim") and file is not None and \
        str(Path(file).resolve()).startswith(FAKE_DIR + os.sep)


def _purge(prefixes=("cupy", "cupyx", "cupy_backends")) -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in prefixes:
            del sys.modules[name]


#: Why the real CuPy was not used (None until :func:`install` chose the stand-in).
not_real_reason = None


def _real_cupy_mode():
    """"real" if a real CuPy (found outside the fake dir) imports and sees a device, else None
    (and :data:`not_real_reason` says why)."""
    global not_real_reason
    path = [p for p in sys.path if str(Path(p or ".").resolve()) != FAKE_DIR]
    saved = sys.path[:]
    try:
        sys.path[:] = path
        if importlib.util.find_spec("cupy") is None:
            not_real_reason = "CuPy is not installed"
            return None
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
        if count >= 1:
            return "real"
        not_real_reason = f"CuPy {cupy.__version__} sees {count} CUDA devices"
    except Exception as exc:  # noqa: BLE001  (ImportError or a broken CUDA install: the stand-in it is)
        not_real_reason = f"CuPy did not start: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    finally:
        sys.path[:] = saved
    _purge()  # a real CuPy without a device must not stay half-imported under the stand-in
    return None


def mode() -> str | None:
    """"real" or "sim" if :func:`install` (or PYTHONPATH) already decided, else None."""
    mod = sys.modules.get("cupy")
    if mod is None:
        return None
    return "sim" if _is_stand_in(mod) else "real"


def install() -> str:
    """``"real"`` (a real CuPy with >= 1 device) or ``"sim"`` (the stand-in, now importable as ``cupy``)."""
    current = mode()
    if current is not None:
        return current
    if _real_cupy_mode() == "real":
        return "real"
    if FAKE_DIR not in sys.path:
        sys.path.insert(0, FAKE_DIR)
    if _TESTS_DIR not in sys.path:  # the engine: `from cudasim import hostbuild`
        sys.path.append(_TESTS_DIR)
    cupy = importlib.import_module("cupy")
    if not _is_stand_in(cupy):
        raise ImportError(f"`import cupy` did not load the stand-in from {FAKE_DIR}: got {cupy!r}")
    setattr(cupy, _MARK, True)
    return "sim"


def uninstall() -> bool:
    """Undo :func:`install`'s stand-in (modules and path entry); True if there was one to undo."""
    mod = sys.modules.get("cupy")
    if not (_is_stand_in(mod) and getattr(mod, _MARK, False)):
        return False
    _purge(("cupy",))
    while FAKE_DIR in sys.path:
        sys.path.remove(FAKE_DIR)
    return True
