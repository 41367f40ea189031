"""The MSE search for scales on the GPU: the launch of ``kernels/mse.cu``.

Two launches and one 4-byte read-back: the min/max reduction of :mod:`.qparams`
(:func:`.qparams.minmax_keys`, every scheme), then ``mse_search``, one warp per block, which
forms the 20 candidates from each block's keys, sums their errors in the block's C order and
writes the winner's scale and zero point. The block layout is the strided map of any scheme
(:func:`.qparams.block_dims`): ``x`` is read as a C-contiguous array (a view is copied first, as the
reductions do). The failure flag is :mod:`.qparams`' (+/-Inf in the data, a scale the scale
dtype cannot hold), raised with its messages.
"""

from __future__ import annotations

import math

import numpy as np

from . import qparams
from .registry import mse_codec, mse_name

SOURCE = "mse.cu"
THREADS = 256
_MAX_BLOCKS = 1 << 16
_NULL = np.uint64(0)


def choose_qparams(x, scheme, code, qmin, qmax, symmetric, eps, scale_dtype):
    """Scales and zero points of device ``x`` by the MSE search (validated by ``gpuq.qparams``),
    on ``x``'s device and CuPy's current stream there; ``qmin, qmax, symmetric`` are the code's
    range as the kernels take it (:func:`.backend.kernel_range`)."""
    import cupy

    from .compiler import get_function
    from .launch import device_id, dims_array
    from .registry import mse_names

    if x.size == 0:  # no numbers: every candidate's error is 0, candidate 0 (min/max) wins
        return qparams.choose_qparams(x, scheme, qmin, qmax, symmetric, eps, scale_dtype)
    nd, dims = qparams.block_dims(scheme, "method='mse'")
    with x.device:
        x = cupy.ascontiguousarray(x)
        lo, hi = qparams.minmax_keys(x, scheme)
        scales = cupy.empty(scheme.param_shape, cupy.float32)
        zps = None if (symmetric and qmin < 0) else cupy.empty(scheme.param_shape, cupy.int32)
        flag = qparams.failure_flag()  # this stream's, cleared
        slots = math.prod(scheme.param_shape)
        fn = get_function(SOURCE, tuple(mse_names()), mse_name(x.dtype, mse_codec(code)))
        blocks = min(-(-slots // (THREADS // 32)), _MAX_BLOCKS)
        fn((blocks,), (THREADS,),
           (x, np.int32(nd), dims_array(device_id(x), dims), np.int64(slots), lo, hi, np.int32(qmin),
            np.int32(qmax), np.int32(symmetric), np.float32(eps),
            np.int32(qparams.SCALE_FMT[scale_dtype]), scales, _NULL if zps is None else zps, flag))
        qparams.raise_on_failure(flag, scale_dtype)
    return scales, zps
