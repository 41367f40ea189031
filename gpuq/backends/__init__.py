"""The backends: where the work of one call is done, below the validation.

:mod:`.host` runs host (NumPy) arrays on the CPU, :mod:`.cuda` runs device arrays with gpuq's
CUDA kernels. Each exposes one backend class implementing :class:`.protocol.Backend` completely
(the same static methods, the same signatures: ``tests/test_layout.py`` checks it): arrays,
placing parameters, value checks, quantize/dequantize for every row of the code-type table
(:mod:`gpuq._codetypes`), min/max and parameters from data. The layers above find a backend one
way (``gpuq._dispatch.backend_for``), validate everything, and call these methods; nothing here
re-validates, and the rows' codec and storage choose the element operation only in here.

May import: :mod:`gpuq._codetypes`, :mod:`gpuq._dtypes` and :mod:`gpuq._scheme` (the core types)
and their own modules; host and cuda never import each other, share no private names, and
nothing here imports the layers above.
"""
