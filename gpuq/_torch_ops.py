"""gpuq's four functions as registered torch ops (``torch.ops.gpuq.*``): schemas, kernels, fakes.

Imported by :mod:`gpuq.torch` only (it imports torch). Each op's kernel is the
eager function itself on the op's tensors, so an op gives the eager call's bits
on the device and stream the interop layer chooses (``gpuq/_interop.py``: CPU
tensors zero copy on the host, CUDA tensors on torch's current stream);
``quantize`` and ``dequantize`` write into a tensor torch allocates (``out=``),
so that under CUDA graph capture their output lives in the graph's pool. Its
fake (meta) implementation gives the exact output shapes and dtypes from
metadata alone, symbolic shapes included, and raises the eager call's
``TypeError``/``ValueError`` for shape and dtype errors; value errors (a scale
of 0, a zero point beyond int32, Inf in ``choose_qparams``) need the data and
come from the kernel when it runs.

Graph outputs must be tensors, so where the eager call returns a
:class:`gpuq.Codes` (int4/uint4/fp4) an op returns its packed bytes (1-D uint8,
``ceil(n / 2)``), and ``dequantize`` takes them back with ``packed=`` (the code
dtype) and ``shape=`` (the logical shape); fp6 codes are a uint8 tensor of
src's shape (torch has no fp6), read back with ``packed=`` naming them (see
:func:`uint8_bytes`). NVFP4's ``global_scale`` is a ``float?`` keyword of all four. ``choose_qparams`` and
``quantize_dynamic`` return lists: the zero points are left out exactly where
the eager call returns None for them (symmetric int8/int4, fp8).

Every argument after the tensors is keyword-only, so a new one with a default is
appended to a schema without changing any existing call; the dispatcher drops
arguments equal to their defaults from graphs and exported programs, which
therefore stay valid as well. ``block_size`` (block scales) came that way: the
last keyword of each schema.

The ops record nothing for autograd, as the eager calls read their inputs as
``detach()`` does: outputs never require grad (registered, so ``opcheck``'s
autograd check holds).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import _scheme, api, qparams
from ._codes import Codes
from ._codetypes import CODE_TYPES, fp8_dtype
from ._dtypes import FLOAT_DTYPES, as_dtype, bfloat16, dtype_name
from ._nvfp4 import check_global_scale
from ._params import check_saturate, check_shape, quantize_code
from ._qoptions import scale_rule as scale_rule_of
from ._qoptions import validate
from ._scheme import Scheme

__all__ = ["SCHEMAS", "scheme", "eager_axis", "dtype_name_of", "uint8_bytes", "register"]

#: The op schemas, pinned (tests/test_torch_ops.py compares them with the registered ones).
SCHEMAS = {
    "quantize": "(Tensor src, Tensor scales, Tensor? zps=None, *, int[]? axis=None, "
                "int? group_size=None, str dtype=\"int8\", bool saturate=True, "
                "bool check_values=True, int[]? block_size=None, float? global_scale=None) -> Tensor",
    "dequantize": "(Tensor src, Tensor scales, Tensor? zps=None, *, int[]? axis=None, "
                  "int? group_size=None, str? packed=None, SymInt[]? shape=None, "
                  "str dtype=\"float32\", bool check_values=True, int[]? block_size=None, "
                  "float? global_scale=None) -> Tensor",
    "choose_qparams": "(Tensor x, *, int[]? axis=None, int? group_size=None, str dtype=\"int8\", "
                      "bool? symmetric=None, float? eps=None, int[]? block_size=None, "
                      "str scale_dtype=\"float32\", str method=\"minmax\", str? scale_rule=None, "
                      "float? global_scale=None) -> Tensor[]",
    "quantize_dynamic": "(Tensor x, *, int[]? axis=None, int? group_size=None, "
                        "str dtype=\"int8\", bool? symmetric=None, int[]? block_size=None, "
                        "str scale_dtype=\"float32\", str method=\"minmax\", str? scale_rule=None, "
                        "float? global_scale=None, bool check_values=True) -> Tensor[]",
}


# -- arguments ---------------------------------------------------------------------------------

def eager_axis(axis):
    """The op's ``int[]? axis`` as the eager functions take it: None, ``k`` for one axis
    (per-channel, or per-group with ``group_size``), a tuple for several.

    >>> eager_axis(None), eager_axis([1]), eager_axis([0, 2]), eager_axis([])
    (None, 1, (0, 2), ())
    """
    if axis is None:
        return None
    return axis[0] if len(axis) == 1 else tuple(axis)


def scheme(shape, axis, group_size, block_size=None) -> Scheme:
    """The :class:`Scheme` of a shape whose sizes may be symbolic (``torch.SymInt``).

    Plain sizes get gpuq's own ``Scheme``, built as the eager call builds it. Symbolic ones
    are kept as torch gives them, so that ``param_shape`` stays symbolic instead of turning
    each size into an int: ``axis`` and ``group_size`` are checked on a stand-in of the same
    rank (those errors depend on the rank alone), and blocks are normalised against the
    sizes themselves (comparisons, which torch turns into guards, not ints).

    >>> scheme((4, 6), 1, 4).param_shape, scheme((4, 6), (0, 1), None).kind
    ((4, 2), 'axes')
    >>> scheme((300, 200), None, None, (128, -1)).param_shape
    (3, 1)
    """
    shape = tuple(shape)
    if all(type(d) is int for d in shape):  # _build: no lru_cache (dynamo warns of one it skips)
        return Scheme._build(shape, axis, group_size, block_size)
    if block_size is not None:
        return Scheme(shape, "block", (), None, _scheme._blocks(block_size, shape, axis, group_size))
    like = Scheme._build((1,) * len(shape), axis, group_size)
    return Scheme(shape, like.kind, like.axes, like.group_size)


def dtype_name_of(t) -> str:
    """A tensor's torch dtype by gpuq's (and NumPy's) name for it.

    >>> dtype_name_of(torch.ones(1, dtype=torch.bfloat16)), dtype_name_of(torch.ones(1, dtype=torch.int8))
    ('bfloat16', 'int8')
    """
    return str(t.dtype).rpartition(".")[2]


def _check_params(scales, zps, scheme_, src):
    """Metadata checks of scales and zero points, with the eager call's words and rules:
    ``gpuq/_params.py`` reads CPU tensors as host values (integer scales and an empty float
    zps converted) and CUDA tensors as device arrays (floating scales, integer zps only)."""
    for t, argname in ((scales, "scales"), (zps, "zps")):
        if t is None:
            continue
        on_device = t.device.type != "cpu"
        if on_device and src.device.type == "cpu":
            raise TypeError(
                f"{argname} is a device (CUDA) array but src is a host NumPy array; gpuq does not "
                f"copy between host and device behind your back: pass host {argname} or a device src")
        integer = not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool
        if argname == "scales" and not (t.is_floating_point() or (integer and not on_device)):
            raise TypeError(f"scales must be {'a floating array' if on_device else 'floating'} "
                            f"(float32), got {dtype_name_of(t)}")
        if argname == "zps" and not (integer or (t.is_floating_point() and not on_device and t.numel() == 0)):
            raise TypeError(f"zps must be integers (int8, uint8 or int32), got {dtype_name_of(t)}")
        check_shape(t, scheme_, argname)


# -- quantize ----------------------------------------------------------------------------------

def _quantize(src, scales, zps=None, *, axis=None, group_size=None, dtype="int8", saturate=True,
              check_values=True, block_size=None, global_scale=None):
    out = _quantize_fake(src, scales, zps, axis=axis, group_size=group_size, dtype=dtype, saturate=saturate,
                         block_size=block_size, global_scale=global_scale)
    code = quantize_code(dtype, None)
    into = Codes(out, tuple(src.shape), code.name) if uint8_bytes(code) else out
    api.quantize(src, scales, zps, axis=eager_axis(axis), group_size=group_size, block_size=block_size,
                 dtype=dtype, out=into, saturate=saturate, check_values=check_values, global_scale=global_scale)
    return out


def _quantize_fake(src, scales, zps=None, *, axis=None, group_size=None, dtype="int8", saturate=True,
                   check_values=True, block_size=None, global_scale=None):
    """The codes tensor ``quantize`` makes, empty, after the eager call's metadata checks in its
    order (gpuq/api.py). The fake, and the kernel's output: torch's allocator, on torch's current
    stream and, while a CUDA graph is captured, in its pool (CuPy's would allocate outside it)."""
    if dtype_name_of(src) not in FLOAT_DTYPES.names:
        raise TypeError(f"src must be float16, float32, float64 or bfloat16 to quantize, "
                        f"got {dtype_name_of(src)}")
    code = quantize_code(dtype, None)
    check_saturate(saturate, code)
    s = scheme(src.shape, eager_axis(axis), group_size, block_size)
    _check_params(scales, None, s, src)
    _check_global_scale(global_scale, code)  # between the scales and the zero points, as eagerly
    _check_params(None, zps, s, src)
    return _codes_like(src, code)


def uint8_bytes(code) -> bool:
    """Whether torch holds ``code``'s codes as uint8 bytes that do not name the code type: packed
    int4/uint4/fp4, and fp6 (one code per byte; torch has no fp6). Those travel as a
    :class:`gpuq.Codes` of the bytes inside the kernels, and as the bytes with ``packed=`` (the
    code dtype) between ops.

    >>> from gpuq._codetypes import CODE_TYPES
    >>> [name for name, row in CODE_TYPES.items() if uint8_bytes(row)]
    ['int4', 'uint4', 'float4_e2m1fn', 'float6_e2m3fn', 'float6_e3m2fn']
    """
    return not code.torch_native  # their bytes travel as uint8 tensors (int4, fp4 packed; fp6)


def _check_global_scale(global_scale, code):
    """NVFP4's ``global_scale`` of quantize/dequantize, checked as the eager call checks it."""
    if global_scale is not None:
        api._nvfp4_scales(np.ones((), np.float32), global_scale, code)


def _codes_like(src, code):
    """An empty tensor of the codes ``quantize`` makes of ``src`` for the code type ``code``:
    one per element in torch's dtype of them, or packed bytes."""
    if code.storage == "packed":
        return src.new_empty((code.packed_size(src.numel()),), dtype=torch.uint8)
    return src.new_empty(src.shape, dtype=getattr(torch, code.torch))


# -- dequantize --------------------------------------------------------------------------------

def _dequantize(src, scales, zps=None, *, axis=None, group_size=None, packed=None, shape=None,
                dtype="float32", check_values=True, block_size=None, global_scale=None):
    out = _dequantize_fake(src, scales, zps, axis=axis, group_size=group_size, packed=packed, shape=shape,
                           dtype=dtype, block_size=block_size, global_scale=global_scale)
    codes = src if packed is None else Codes(src, tuple(out.shape), packed)
    return api.dequantize(codes, scales, zps, axis=eager_axis(axis), group_size=group_size,
                          block_size=block_size, dtype=dtype, out=out, check_values=check_values,
                          global_scale=global_scale)


def _dequantize_fake(src, scales, zps=None, *, axis=None, group_size=None, packed=None, shape=None,
                     dtype="float32", check_values=True, block_size=None, global_scale=None):
    """The float tensor ``dequantize`` makes, empty, after the eager call's metadata checks:
    the fake, and the kernel's output (as for quantize)."""
    if packed is None:  # codes one per element: a dtype of the table's (gpuq/_dispatch.py: source_codes)
        code = CODE_TYPES.get(dtype_name_of(src)) if src.dtype.itemsize == 1 else None
        if code is None or code.storage == "packed":
            raise TypeError(f"src must be int8 or uint8 codes, an fp8 array or gpuq.Codes to dequantize, "
                            f"got {dtype_name_of(src)}")
        logical = tuple(src.shape)
    else:
        code, logical = _check_packed(src, packed, shape)
    out_dtype = dtype_name(as_dtype(dtype, "dtype", FLOAT_DTYPES))
    s = scheme(logical, eager_axis(axis), group_size, block_size)
    _check_params(scales, None, s, src)
    _check_global_scale(global_scale, code)
    _check_params(None, zps, s, src)
    return src.new_empty(logical, dtype=getattr(torch, out_dtype))


def _check_packed(src, packed, shape):
    """``(code, logical shape)`` of uint8 codes ``src`` whose code dtype ``packed`` names (packed
    int4/uint4/fp4 with ``shape``; fp6, one code per byte, whose ``shape`` is src's), checked as
    :class:`gpuq.Codes` checks them (its messages), without turning symbolic sizes into ints."""
    code = CODE_TYPES.get(packed)
    if code is None or not uint8_bytes(code):
        names = [name for name, row in CODE_TYPES.items() if uint8_bytes(row)]
        raise ValueError(f"packed must be one of {', '.join(names)} (src holds their codes as uint8 bytes), "
                         f"got {packed!r}")
    if shape is None and code.storage == "packed":
        raise ValueError(f"shape is required with packed={packed!r}: the codes' logical shape")
    shape = tuple(src.shape) if shape is None else tuple(shape)
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ValueError(f"shape must be a tuple of non-negative ints, got {shape!r}")
    if src.dtype != torch.uint8:  # "Tensor": the eager call's word for a real tensor
        raise TypeError(f"data must be a uint8 array, got Tensor of dtype {src.dtype}")
    if code.storage != "packed":
        if tuple(src.shape) != shape:
            raise ValueError(f"data must hold the shape for {packed} codes of shape {shape}: "
                             f"expected data.shape {shape}, got {tuple(src.shape)}")
        return code, shape
    want = (code.packed_size(math.prod(shape)),)
    if tuple(src.shape) != want:
        raise ValueError(f"data must hold ceil(prod(shape) / 2) bytes, 1-D for {packed} codes of shape "
                         f"{shape}: expected data.shape {want}, got {tuple(src.shape)}")
    if not src.is_contiguous():
        raise ValueError("data of int4/uint4 codes must be C-contiguous (the bytes are packed), "
                         "got a strided view (strides None)")
    return code, shape


# -- choose_qparams and quantize_dynamic -------------------------------------------------------

def _choose_qparams(x, *, axis=None, group_size=None, dtype="int8", symmetric=None, eps=None, block_size=None,
                    scale_dtype="float32", method="minmax", scale_rule=None, global_scale=None):
    return _present(qparams.choose_qparams(x, axis=eager_axis(axis), group_size=group_size,
                                           block_size=block_size, dtype=dtype, symmetric=symmetric, eps=eps,
                                           scale_dtype=scale_dtype, method=method, scale_rule=scale_rule,
                                           global_scale=global_scale))


def _choose_qparams_fake(x, *, axis=None, group_size=None, dtype="int8", symmetric=None, eps=None,
                         block_size=None, scale_dtype="float32", method="minmax", scale_rule=None,
                         global_scale=None):
    _, s, with_zps = _qparams_meta(x, axis, group_size, block_size, dtype, symmetric, eps, scale_dtype,
                                   method, scale_rule, global_scale)
    return _params_like(x, s, with_zps)


def _quantize_dynamic(x, *, axis=None, group_size=None, dtype="int8", symmetric=None, block_size=None,
                      scale_dtype="float32", method="minmax", scale_rule=None, global_scale=None,
                      check_values=True):
    q, scales, zps = qparams.quantize_dynamic(x, axis=eager_axis(axis), group_size=group_size,
                                              block_size=block_size, dtype=dtype, symmetric=symmetric,
                                              scale_dtype=scale_dtype, method=method, scale_rule=scale_rule,
                                              global_scale=global_scale, check_values=check_values)
    return _present((q.data if isinstance(q, Codes) else q, scales, zps))


def _quantize_dynamic_fake(x, *, axis=None, group_size=None, dtype="int8", symmetric=None, block_size=None,
                           scale_dtype="float32", method="minmax", scale_rule=None, global_scale=None,
                           check_values=True):
    code, s, with_zps = _qparams_meta(x, axis, group_size, block_size, dtype, symmetric, None, scale_dtype,
                                      method, scale_rule, global_scale)
    return [_codes_like(x, code), *_params_like(x, s, with_zps)]


def _present(results):
    """The results as an op returns them: a list without the zero points the eager call gives as None."""
    return [r for r in results if r is not None]


def _qparams_meta(x, axis, group_size, block_size, dtype, symmetric, eps, scale_dtype, method, scale_rule=None,
                  global_scale=None):
    """``(code, scheme, with_zps)`` of a choose_qparams/quantize_dynamic call, its arguments
    checked by the eager call's own validation on a NumPy stand-in of x (its dtype and shape),
    the scale rules' (MX, NVFP4) included."""
    _, _, _, code, symmetric, _, sdt, method_ = validate(_stand_in(x), eager_axis(axis), group_size, block_size,
                                                         dtype, symmetric, eps, scale_dtype, method, scale_rule)
    if scale_rule_of(scale_rule, sdt, code, eps, method_, global_scale) == "nvfp4":
        check_global_scale(global_scale)
    # Zero points are None where they are all 0 by the formula: symmetric codes centred on 0.
    with_zps = not symmetric or bool(code.symmetric_zp)
    return code, scheme(x.shape, eager_axis(axis), group_size, block_size), with_zps


def _params_like(x, s, with_zps):
    scales = x.new_empty(s.param_shape, dtype=torch.float32)
    return [scales, x.new_empty(s.param_shape, dtype=torch.int32)] if with_zps else [scales]


def _stand_in(t):
    """A NumPy array of ``t``'s dtype and shape (one element behind zero strides; ones for
    symbolic sizes): what the eager validation reads of ``t``, without its data."""
    name = dtype_name_of(t)
    if name == "bfloat16":
        dt = bfloat16()
    elif CODE_TYPES.get(name) is not None and CODE_TYPES[name].codec == "float8":
        dt = fp8_dtype(name)
    else:
        try:
            dt = np.dtype(name)
        except TypeError:  # a torch dtype NumPy lacks (complex32, qint8...): never a float gpuq takes
            raise TypeError(f"x must be float16, float32, float64 or bfloat16, got {name}") from None
    shape = tuple(d if type(d) is int else 1 for d in t.shape)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dt), shape, (0,) * len(shape))


# -- registration ------------------------------------------------------------------------------

_KERNELS = {
    "quantize": (_quantize, _quantize_fake),
    "dequantize": (_dequantize, _dequantize_fake),
    "choose_qparams": (_choose_qparams, _choose_qparams_fake),
    "quantize_dynamic": (_quantize_dynamic, _quantize_dynamic_fake),
}


def _no_grad_context(ctx, inputs, keyword_only_inputs=None, output=None):
    outputs = output if isinstance(output, (list, tuple)) else (output,)
    ctx.mark_non_differentiable(*outputs)


def _no_grad(ctx, *grads):  # never called: every output is non-differentiable
    return (None,) * len(ctx.needs_input_grad)


def register() -> dict:
    """Define the ops in the ``gpuq`` namespace (once per process) and return them by name.

    >>> import torch, gpuq.torch
    >>> str(torch.ops.gpuq.quantize.default._schema).split("(")[0]
    'gpuq::quantize'
    """
    ops = {}
    for name, (kernel, fake) in _KERNELS.items():
        op = torch.library.custom_op(f"gpuq::{name}", kernel, mutates_args=(), schema=SCHEMAS[name])
        op.register_fake(fake)
        op.register_autograd(_no_grad, setup_context=_no_grad_context)
        ops[name] = op
    return ops
