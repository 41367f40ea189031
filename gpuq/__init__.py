"""gpuq: quantize and dequantize tensors where they live.

CUDA kernels for GPU arrays, a blocked multi-threaded NumPy backend for host
arrays; one numerical contract, bit-identical on both (see README.md).
This package is the public API; the layers below it are :mod:`gpuq.backends`
(host and cuda), and above it :mod:`gpuq.cli` (README: "How the code is laid
out").

>>> import numpy as np, gpuq
>>> q = gpuq.quantize(np.array([0.5, 1.5, -3.0], np.float32), 1.0)
>>> q, gpuq.dequantize(q, 1.0)
(array([ 0,  2, -3], dtype=int8), array([ 0.,  2., -3.], dtype=float32))
"""

from ._codes import Codes, pack, unpack
from ._mx import e8m0_bytes, e8m0_scales
from ._nvfp4 import global_scale
from .api import dequantize, quantize
from .backends.host.choice import get_host_kernels, set_host_kernels
from .backends.host.threads import get_num_threads, set_num_threads
from .ops import Dequantize, DynamicDequantize, DynamicQuantize, Quantize
from .qparams import choose_qparams, quantize_dynamic

__version__ = "0.1.0"

import sys as _sys

if "torch" in _sys.modules:  # gpuq's torch ops, registered before any compile (gpuq/torch.py)
    try:
        from . import torch as _torch  # noqa: F401  (import gpuq never imports torch itself)
    except ImportError:  # a torch without custom ops (< 2.4): eager calls work as before, no ops
        pass

__all__ = [
    "quantize",
    "dequantize",
    "choose_qparams",
    "quantize_dynamic",
    "Quantize",
    "Dequantize",
    "DynamicQuantize",
    "DynamicDequantize",
    "Codes",
    "pack",
    "unpack",
    "e8m0_bytes",
    "e8m0_scales",
    "global_scale",
    "get_num_threads",
    "set_num_threads",
    "get_host_kernels",
    "set_host_kernels",
    "__version__",
]
