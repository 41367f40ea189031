"""The backends: where the work of one call is done, below the dispatcher.

:mod:`.host` runs host (NumPy) arrays on the CPU, :mod:`.cuda` runs device
arrays with gpuq's CUDA kernels. Each exposes one backend class with the same
methods (``quantize``, ``dequantize``, ``empty``, ``to_param``, the value
checks) and a ``qparams`` module for parameters from data; the front end
(:mod:`gpuq.api`, :mod:`gpuq.qparams`, :mod:`gpuq.ops`) validates everything
before it calls them, and nothing here re-validates.

May import: :mod:`gpuq._dtypes` and :mod:`gpuq._scheme` (the core types) and
their own modules; host and cuda never import each other, and nothing here
imports the front end above.
"""
