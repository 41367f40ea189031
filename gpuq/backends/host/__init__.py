"""The host backend: NumPy arrays, on the CPU, in cache-sized blocks over a small thread pool.

:mod:`.backend` (``NumpyBackend``, the protocol's methods: the row of a code type chooses the
module below), :mod:`.affine` (the one-byte integer codes: the ufunc loops and the compiled
blocks; int4 shares its block functions), :mod:`.formats` (fp8 and packed int4/uint4),
:mod:`.qparams` (parameters from data), :mod:`.mse` (the MSE search for scales; its numba
loops in :mod:`.mse_loops`), :mod:`.threads` (the pool, scratch, running plans),
:mod:`.blocks` (cutting a broadcast problem into blocks), :mod:`.loops` (the compiled numba
loops, optional) and :mod:`.choice` (which loops serve host arrays: numba or NumPy ufuncs).

May import: :mod:`gpuq._codetypes`, :mod:`gpuq._dtypes`, and its own modules. numba is imported
only by :mod:`.loops` and :mod:`.mse_loops`, and only when :mod:`.choice` first needs them.
"""
