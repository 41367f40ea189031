"""gpuq inside ``torch.compile``, ``torch.export`` and CUDA graphs: gpuq's functions as torch ops.

``import gpuq.torch`` (or ``import gpuq`` once torch is imported) registers four
ops in the ``gpuq`` namespace, ``torch.ops.gpuq.quantize``, ``dequantize``,
``choose_qparams`` and ``quantize_dynamic`` (schemas in :data:`SCHEMAS`; kernels,
fakes and what they return in ``gpuq/_torch_ops.py``). Register them before
compiling: registering inside a compiled function is a graph break.

While torch traces (dynamo under ``torch.compile`` and strict ``torch.export``;
fake tensors under non-strict ``torch.export`` or a ``FakeTensorMode``), the
public functions ``gpuq.quantize``, ``gpuq.dequantize``, ``gpuq.choose_qparams``
and ``gpuq.quantize_dynamic`` hand torch tensors to these ops (the hook in
``gpuq/_interop.py``), so a compiled function that calls them is one graph, and
it returns what the eager call returns: torch tensors, fp8 as torch fp8
tensors, int4/uint4/fp4 as a :class:`gpuq.Codes` whose ``data`` is the packed
uint8 tensor, fp6 as a uint8 tensor, zero points None where the eager call
gives None; MX and NVFP4 scales (``global_scale=`` a number) as eagerly. Outside
tracing, nothing changes: the eager call runs as before (``gpuq/_interop.py``).
Scales and zero points may be torch tensors, NumPy arrays, Python numbers or
lists; ``out=`` is a torch tensor (or the Codes of one), written through
``copy_`` after the op. The op objects (``gpuq.Quantize`` ...) have no op: under
``torch.compile`` they are a graph break.

>>> import torch, gpuq, gpuq.torch
>>> @torch.compile(fullgraph=True, backend="aot_eager")
... def roundtrip(x):
...     q, s, z = gpuq.quantize_dynamic(x, axis=0)
...     return gpuq.dequantize(q, s, z, axis=0)
>>> x = torch.tensor([[0.5, -1.0, 2.0], [10.0, 20.0, -5.0]])
>>> roundtrip(x)                                      # doctest: +SKIP
tensor([[ 0.5020, -1.0039,  2.0000],
        [ 9.9804, 20.0000, -5.0000]])
"""

from __future__ import annotations

import operator
import sys

import numpy as np

try:
    import torch
    from torch._subclasses.fake_tensor import is_fake
except ImportError as exc:  # gpuq itself never needs torch; this module is torch's side of it
    raise ImportError("gpuq.torch registers gpuq's torch ops and needs torch: pip install torch") from exc
if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"gpuq.torch needs torch >= 2.4 (torch.library.custom_op), got torch {torch.__version__}")

from . import _interop, api, qparams
from ._codes import Codes
from ._codetypes import CODE_TYPES, as_code_type, code_type
from ._dtypes import FLOAT_DTYPES, as_dtype
from ._nvfp4 import check_global_scale
from ._params import check_saturate
from ._qoptions import check_bool, check_options
from ._torch_ops import SCHEMAS, dtype_name_of, register, scheme, uint8_bytes

__all__ = ["OPS", "SCHEMAS"]

#: The registered ops by name (``torch.library.CustomOpDef``; ``torch.ops.gpuq.<name>`` too).
OPS = register()


# -- when to route -----------------------------------------------------------------------------

def traced(src) -> bool:
    """Whether ``src`` (a tensor, or the Codes of one) is being traced by torch.

    Under dynamo ``is_dynamo_compiling()`` is the constant True and the rest is never
    looked at; at run time it is False, so an op's own kernel, which calls the eager
    function on real tensors (also while inductor folds constants), never comes back here.
    Fake tensors (non-strict ``torch.export``, a ``FakeTensorMode``) are traced too.

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> traced(torch.ones(3)), traced(FakeTensorMode().from_tensor(torch.ones(3)))
    (False, True)
    """
    t = src.data if type(src) is Codes else src
    if not isinstance(t, torch.Tensor):
        return False
    if torch.compiler.is_dynamo_compiling():
        return True
    return type(t) is not torch.Tensor and is_fake(t)  # a plain tensor at once: eager calls pay 0.1 us


def route(fn):
    """The op-calling twin of the eager function ``fn`` (undecorated), or None (the op objects).

    >>> import gpuq
    >>> route(gpuq.quantize.__wrapped__).__name__, route(gpuq.Quantize.__call__.__wrapped__)
    ('_quantize', None)
    """
    return _ROUTES.get(f"{fn.__module__}.{fn.__name__}")


# -- arguments in, results out -----------------------------------------------------------------

def _granularity(src, axis, group_size, block_size):
    """``axis``, ``group_size`` and ``block_size`` as the ops take them (``int[]?``, ``int?``,
    ``int[]?``), checked by gpuq's own rules first: the ops cannot tell ``axis=k`` from
    ``axis=(k,)``, which refuses a ``group_size``."""
    scheme(src.shape, axis, group_size, block_size)
    if axis is not None:
        axis = [operator.index(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
    if block_size is not None:
        block_size = [operator.index(b) for b in block_size]
    return dict(axis=axis, group_size=group_size, block_size=block_size)


def _param(value, argname):
    """Scales or zero points as a tensor: tensors as they are, NumPy arrays zero copy, Python
    numbers and lists as NumPy would read them (floats float64; ints float64 for scales, as the
    eager call converts them, int64 for zero points; bools stay bool and are refused)."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    flat = _leaves(value)  # NumPy scalars as their Python twins (dynamo's strict tracing does so)
    if flat and all(isinstance(v, (bool, np.bool_)) for v in flat):
        dtype = torch.bool
    elif argname == "zps" and all(isinstance(v, (int, np.integer)) for v in flat):
        dtype = torch.int64
    else:
        dtype = torch.float64
    return torch.tensor(value, dtype=dtype)


def _leaves(value):
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _dtype_name(dtype, normalise):
    """A dtype argument as the ops take it, by name: NumPy and ml_dtypes dtypes and types by
    theirs (``normalise`` is the eager call's own reading, which refuses what is no dtype)."""
    return dtype if isinstance(dtype, str) else normalise(dtype).name


def _float_dtype(dtype):
    return as_dtype(dtype, "dtype", FLOAT_DTYPES)


def _codes(data, shape, name):
    """``gpuq.Codes(data, shape, name)`` for bytes an op has just made (so they fit).

    Built without ``Codes.__init__``, whose checks dynamo cannot trace (``callable`` of a
    tensor method); the op's fake has checked the same things already.
    """
    codes = object.__new__(Codes)
    for attr, value in (("data", data), ("shape", tuple(shape)), ("dtype", name)):
        object.__setattr__(codes, attr, value)
    return codes


def _into(out, result):
    """Copy ``result`` into the caller's ``out`` (a tensor, or the Codes of one) and return
    ``out``, with the eager call's errors for an ``out`` that does not fit."""
    target = out
    if isinstance(result, Codes):
        if not isinstance(out, Codes):
            raise TypeError(f"out must be a gpuq.Codes for {result.dtype} codes, "
                            f"got {type(out).__qualname__}")
        if out.dtype != result.dtype or out.shape != result.shape:
            raise ValueError(f"out must be Codes of dtype {result.dtype} and shape {result.shape} (src's), "
                             f"got dtype {out.dtype} and shape {out.shape}")
        target, result = out.data, result.data
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"out must be a torch tensor for a torch src while torch traces, "
                        f"got {type(target).__qualname__}")
    if target.dtype != result.dtype:
        raise TypeError(f"out must have dtype {dtype_name_of(result)}, got {dtype_name_of(target)}")
    if tuple(target.shape) != tuple(result.shape):
        raise ValueError(f"out must have shape {tuple(result.shape)} (the shape of src), "
                         f"got {tuple(target.shape)}")
    target.copy_(result)
    return out


def _out_dtype(out, default):
    if out is None:
        return default
    return out.dtype if isinstance(out, Codes) else dtype_name_of(out)


def _as_codes(q, src, dtype):
    """An op's codes as the eager call returns them: packed bytes (int4/uint4/fp4) as Codes
    (fp6 stays the uint8 tensor the eager call returns)."""
    code = code_type(dtype)
    return _codes(q, src.shape, code.name) if code is not None and code.storage == "packed" else q


def _global_scale(gs):
    """``global_scale`` as the schema's ``float?``: a Python float as it is (dynamo may trace it
    as a symbolic float; the op's fake and kernel check its value), anything else (NumPy's
    float32, a 0-d array) checked as the eager call checks it, as the float of the same value."""
    if gs is None or type(gs) is float:
        return gs
    return float(check_global_scale(gs))


# -- the four routes ---------------------------------------------------------------------------

def _quantize(src, scales, zps=None, *, axis=None, group_size=None, block_size=None, dtype=None, out=None,
              check_values=True, saturate=True, global_scale=None):
    dtype = _dtype_name(dtype, as_code_type) if dtype is not None else _out_dtype(out, "int8")
    code = as_code_type(dtype)
    check_saturate(saturate, code)  # the schema's bool would take 1 or None
    q = torch.ops.gpuq.quantize(src, _param(scales, "scales"), _param(zps, "zps"), dtype=dtype,
                                saturate=saturate, check_values=check_values,
                                global_scale=_global_scale(global_scale),
                                **_granularity(src, axis, group_size, block_size))
    if out is None:
        return _as_codes(q, src, dtype)
    # fp6's out is the Codes of a uint8 tensor, as eagerly (a bare uint8 tensor means uint8 codes)
    return _into(out, _codes(q, src.shape, code.name) if uint8_bytes(code) else q)


def _dequantize(src, scales, zps=None, *, axis=None, group_size=None, block_size=None, dtype=None, out=None,
                check_values=True, global_scale=None):
    data, packed, shape = src, None, None
    if isinstance(src, Codes):
        code = CODE_TYPES[src.dtype]
        if uint8_bytes(code):  # packed int4/uint4/fp4, fp6: the bytes and their code dtype
            data, packed, shape = src.data, code.name, list(src.shape)
        else:  # fp8 bits: torch's fp8 tensor of them
            data = src.data.view(getattr(torch, code.torch))
    dtype = _dtype_name(dtype, _float_dtype) if dtype is not None else _out_dtype(out, "float32")
    y = torch.ops.gpuq.dequantize(data, _param(scales, "scales"), _param(zps, "zps"), packed=packed,
                                  shape=shape, dtype=dtype, check_values=check_values,
                                  global_scale=_global_scale(global_scale),
                                  **_granularity(src, axis, group_size, block_size))
    return y if out is None else _into(out, y)


def _choose_qparams(x, *, axis=None, group_size=None, block_size=None, dtype="int8", symmetric=None, eps=None,
                    scale_dtype="float32", method="minmax", scale_rule=None, global_scale=None):
    # checked here as the eager call checks them: the schema's bool?/float? would take 1 or True
    symmetric, eps, scale_dtype, method = check_options(symmetric, eps, scale_dtype, method, scale_rule)
    scales, *zps = torch.ops.gpuq.choose_qparams(x, dtype=_dtype_name(dtype, as_code_type), symmetric=symmetric,
                                                 eps=eps, scale_dtype=scale_dtype, method=method,
                                                 scale_rule=scale_rule, global_scale=_global_scale(global_scale),
                                                 **_granularity(x, axis, group_size, block_size))
    return scales, (zps[0] if zps else None)


def _quantize_dynamic(x, *, axis=None, group_size=None, block_size=None, dtype="int8", symmetric=None,
                      scale_dtype="float32", method="minmax", scale_rule=None, global_scale=None,
                      check_values=True):
    dtype = _dtype_name(dtype, as_code_type)
    symmetric, _, scale_dtype, method = check_options(symmetric, None, scale_dtype, method, scale_rule)
    check_bool(check_values, "check_values")
    q, scales, *zps = torch.ops.gpuq.quantize_dynamic(x, dtype=dtype, symmetric=symmetric, scale_dtype=scale_dtype,
                                                      method=method, scale_rule=scale_rule,
                                                      global_scale=_global_scale(global_scale),
                                                      check_values=bool(check_values),
                                                      **_granularity(x, axis, group_size, block_size))
    return _as_codes(q, x, dtype), scales, (zps[0] if zps else None)


_ROUTES = {f"{api.__name__}.quantize": _quantize, f"{api.__name__}.dequantize": _dequantize,
           f"{qparams.__name__}.choose_qparams": _choose_qparams,
           f"{qparams.__name__}.quantize_dynamic": _quantize_dynamic}

_interop.torch_ops = sys.modules[__name__]  # from now on the public functions route while torch traces
