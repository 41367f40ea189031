"""The host backend: NumPy arrays, on the CPU, in cache-sized blocks over a small thread pool.

:mod:`.backend` (``NumpyBackend``, the thread pool, the ufunc loops),
:mod:`.blocks` (cutting a broadcast problem into blocks), :mod:`.loops` (the
compiled numba loops, optional), :mod:`.choice` (which loops serve host
arrays: numba or NumPy ufuncs) and :mod:`.qparams` (parameters from data).

May import: :mod:`gpuq._dtypes`, and its own modules. numba is imported only
by :mod:`.loops`, and only when :mod:`.choice` first needs it.
"""
