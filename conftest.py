"""Collection rules for the whole tree (pytest's rootdir conftest).

The doctests of ``gpuq/`` are collected by importing every module
(``--doctest-modules``). ``gpuq/backends/host/loops.py`` (and ``mse_loops.py``, which
builds on it) imports numba at module level, so where numba is missing or broken (an ImportError, or any
error a broken install raises) its import would be a collection error that
aborts the whole run. The library itself falls back to the NumPy ufunc loops
then (:mod:`gpuq.backends.host.choice`); the tests lose the numba parameters
only (``tests/conftest.py``), and the doctests lose those modules.
"""

from gpuq.backends.host import choice

collect_ignore = [] if choice.available() else ["gpuq/backends/host/loops.py",
                                                  "gpuq/backends/host/mse_loops.py",
                                                  "gpuq/backends/host/weight_pass.py"]
