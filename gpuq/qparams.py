"""Quantization parameters from data, and dynamic quantization in one call.

Granularity is asked for exactly as in :func:`gpuq.quantize`, and the scales
and zero points come back in the shape it expects (``Scheme.param_shape``):

============  ===================================  ==========================================
scheme        asked for with                       scales / zps shape for ``x.shape``
============  ===================================  ==========================================
per-tensor    ``axis=None``                         ``()`` (0-d)
per-channel   ``axis=k``                            ``(shape[k],)``
multi-axis    ``axis=(k1, k2, ...)``                ``tuple(shape[k] for k in sorted axes)``
per-group     ``axis=k, group_size=g``              ``shape`` with dim k -> ceil(shape[k] / g)
============  ===================================  ==========================================

Each scale covers a "block": the elements that share it (the whole tensor,
one channel, one multi-axis slot, one group). For a block with smallest
number ``lo`` and largest ``hi``, in float32 arithmetic (float16 and
bfloat16 widened exactly, float64 min/max rounded to float32 once):

* asymmetric (default): the range is widened to include 0,
  ``lo' = min(lo, 0)``, ``hi' = max(hi, 0)``,
  ``scale = (hi' - lo') / (qmax - qmin)``,
  ``zp = clamp(qmin - rint(lo' / scale), qmin, qmax)``. For uint8 this is
  ONNX DynamicQuantizeLinear.
* symmetric: ``scale = max(|lo|, |hi|) / 127``; zero points are ``None``
  for int8 and 128 for uint8.
* symmetric with ``scale_rule="full"`` (integer codes only): the codes' whole range,
  ``scale = max(|lo|, |hi|) / ((qmax - qmin) / 2)``, ``/ 127.5`` for 8-bit codes and
  ``/ 7.5`` for 4-bit, so the block's most negative number may reach ``qmin`` (-128, -8) and its
  largest positive one is clamped to ``qmax``: the rule of torchao's ``choose_qparams_affine``
  (``MappingType.SYMMETRIC``), compressed-tensors' ``calculate_qparams`` and GPTQ, whose float32
  scales it equals bit for bit. Codes are still ``x / scale`` by exact division.
* ``scale = max(scale, eps)`` (``eps`` defaults to the smallest normal
  float32), so an all-zero or empty block gets ``scale = eps``, never 0, Inf
  or NaN. (ONNX uses scale 1/255 for an all-zero input; the codes agree.)
* ``scale_dtype="bfloat16"`` or ``"float16"`` (for checkpoints that store
  scales in the model's dtype, as compressed-tensors and vLLM do): that
  scale, ``eps`` included, is rounded to nearest even in that dtype, and the
  asymmetric zero point is derived from the rounded scale, so the codes, the
  scale and the zero point agree with what is stored. The scale comes back as
  float32 holding exactly the rounded value. With float16 ``eps`` defaults
  to float16's smallest positive value, ``2**-24`` (the float32 one would
  round to 0). A scale that rounds to 0 or overflows that dtype (beyond
  65504 for float16) is a ``ValueError``.
* NaN, quiet or signalling, is ignored by the min/max: a block's range is that of its numbers, and
  a block of NaN only is treated as all zero. NaN then quantizes to the zero
  point, as in :func:`gpuq.quantize`.
* +/-Inf (or a float64 value beyond the float32 range) raises
  ``ValueError``: no finite scale covers it.
* In the rare case that ``hi' - lo'`` overflows float32 (values near
  +/-3.4e38) that difference and its division are done in float64 and
  rounded to float32 once.

``method="mse"`` searches, block by block, for the clipping range whose
quantization error is smallest (the result is still an ordinary scale and
zero point). Candidate ``i`` for ``i = 0 .. 19`` takes the factor
``p_i = float32((100 - i) / 100)`` (``i = 0`` is min/max) and the range
``(p_i * lo, p_i * hi)``, each end a float32 product, and turns it into a
scale and zero point by exactly the rule above (the zero-range rule, ``eps``
and ``scale_dtype``'s rounding included; under ``scale_rule="full"`` that rule's
divisor, so candidate 0 is the full-range scale). Its error is the sum over the
block's numbers (NaN skipped), in the block's C order, of ``d * d`` in
float64, ``d = float64(x) - float64(y)``, where ``y = dequantize(quantize(x))``
with that candidate by the contract's formulas in the compute type (float64
for float64 data, else float32; fp8 saturating), one IEEE operation at a
time (no fused multiply-add in the error; the quotient ``x / s`` is the
correctly rounded one, which the CUDA kernels form from a reciprocal and
fused multiply-adds proven equal to it). The smallest error wins, the smaller ``i`` on
a tie, so a block's error is never above min/max's. A candidate whose scale
rounds to 0 in ``scale_dtype`` (a tiny ``eps`` with float16) is left out;
min/max's own failures (+/-Inf, a scale the dtype cannot hold) raise as
they do for ``"minmax"``. Every backend (both host loops, the CUDA kernels)
evaluates the same sums in the same order and returns the same bits.

``x`` may be an ndarray subclass (read as its base ndarray; results are
plain ndarrays) or in non-native byte order (``>f4``: float32 values, read
through one native copy); masked arrays raise ``TypeError``, as in
:func:`gpuq.quantize`.

The result lives where ``x`` lives; on the GPU the reduction is a kernel
(``kernels/qparams.cu``), and ``x`` is not copied to the host. Checking for
Inf reads back one flag there (a synchronisation).
"""

from __future__ import annotations

import numpy as np  # noqa: F401 (the doctests use it)

from . import _mx, _nvfp4
from ._interop import callers_type
from ._qoptions import EPS, METHODS, SCALE_DTYPES, check_bool, check_options, scale_rule as _scale_rule, validate  # noqa: F401 (gpuq.qparams names them)
from ._dtypes import compute_dtype, native
from .api import encode, quantize

__all__ = ["choose_qparams", "quantize_dynamic", "METHODS"]


@callers_type
def choose_qparams(x, *, axis=None, group_size=None, block_size=None, dtype="int8", symmetric=None,
                   eps=None, scale_dtype="float32", method="minmax", scale_rule=None, global_scale=None):
    """Scales and zero points that cover ``x``, block by block (see the module docstring).

    Parameters
    ----------
    x : float16/float32/float64/bfloat16 array (NumPy, or a CUDA array)
        Not modified. NaN (quiet or signalling) is ignored; +/-Inf raises ``ValueError``.
    axis : None, int or tuple of ints
        ``None`` per-tensor, ``k`` per-channel, a tuple for multi-axis.
    group_size : int, optional
        With an integer ``axis``: one scale per ``group_size`` consecutive
        elements along it (the last group may be shorter).
    dtype : ``"int8"`` (default), ``"uint8"``, ``"int4"``, ``"uint4"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``
        The code dtype the parameters are for (short names and dtypes as in
        :func:`gpuq.quantize`).
    symmetric : bool, optional
        ``scale = max|x| / 127`` (``/ 7`` for 4-bit codes), zero points None
        (int8, int4) or 128 (uint8; 8 for uint4). Default False, except for
        fp8, whose scales are always symmetric, ``max|x| / max_finite`` (448
        for e4m3fn, 57344 for e5m2), with no zero points: ``symmetric=False``
        is a ``ValueError`` there.
    eps : float, optional
        Smallest scale, finite and > 0 in float32; default: smallest normal float32
        (float16's smallest positive value, ``2**-24``, with ``scale_dtype="float16"``).
    scale_dtype : ``"float32"`` (default), ``"bfloat16"``, ``"float16"`` or ``"float8_e8m0fnu"``
        The dtype the scales will be stored in: each scale is rounded to nearest
        even in it before the zero point is derived (see the module docstring);
        returned as float32. A scale that rounds to 0 or overflows it is a ``ValueError``.
        ``"float8_e8m0fnu"``: OCP MX's power-of-two scales by ``scale_rule``, for float codes
        (fp4, fp6, fp8), returned as float32 holding exactly ``2**k`` (:mod:`gpuq._mx`;
        :func:`gpuq.e8m0_bytes` gives the stored bytes); ``eps`` and ``method="mse"`` do not apply.
    scale_rule : ``"floor"``, ``"even"`` (default), ``"ceil"`` or ``"rceil"``
        With ``scale_dtype="float8_e8m0fnu"`` only: how ``2**k`` is chosen from each block's
        ``max|x|`` (:mod:`gpuq._mx`: OCP's floor, compressed-tensors' even, torchao's ceil,
        NVIDIA's rceil).
    global_scale : float, optional
        With ``scale_dtype="float8_e4m3fn"`` (NVFP4, float4_e2m1fn codes) only, and required there:
        :func:`gpuq.global_scale`'s ``gs``; the scales are compressed-tensors' e4m3 block scales
        ``s_b`` as float32 (:mod:`gpuq._nvfp4`); pass both to :func:`gpuq.quantize`.
    method : ``"minmax"`` (default) or ``"mse"``
        ``"minmax"``: each block's range is its min/max. ``"mse"``: the range, among 20
        shrunken ones, whose quantization error is smallest (see the module docstring); about
        20 fake-quantization passes over ``x`` (a CUDA kernel on the GPU, a compiled loop on
        the host with numba). Never a larger error per block than ``"minmax"``.
    scale_rule : None (default) or ``"full"``
        ``"full"``: symmetric integer codes use their whole range, ``scale = max|x| / 7.5``
        (int4; ``/ 127.5`` int8, uint codes by their range) as torchao, compressed-tensors
        and GPTQ do (see the module docstring); a ``ValueError`` with fp8 codes or
        ``symmetric=False``. None: ``max|x| / 7`` (``/ 127``).

    Returns
    -------
    scales : float32 array of the shape :func:`gpuq.quantize` expects
    zps : int32 array of that shape, or None (symmetric int8)

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> x = np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32)
    >>> s, z = gpuq.choose_qparams(x, dtype="uint8")   # ONNX DynamicQuantizeLinear
    >>> s, z
    (array(0.01960784, dtype=float32), array(153, dtype=int32))
    >>> gpuq.choose_qparams(np.array([[1, -4], [2, 8]], np.float32), axis=0, symmetric=True)
    (array([0.03149606, 0.06299213], dtype=float32), None)
    >>> gpuq.choose_qparams(np.zeros((2, 5), np.float32), axis=1, group_size=4)[0].shape
    (2, 2)
    >>> gpuq.choose_qparams(np.float32([1.0, -0.3]), scale_dtype="bfloat16")   # 1.3 / 255, in bfloat16
    (array(0.00509644, dtype=float32), array(-69, dtype=int32))

    Heavy tails: ``method="mse"`` clips the largest values to spend int4's 16 levels on the rest:

    >>> w = np.random.default_rng(0).standard_t(4, 128).astype(np.float32)   # one group of 128
    >>> s0, _ = gpuq.choose_qparams(w, dtype="int4", symmetric=True)
    >>> s1, _ = gpuq.choose_qparams(w, dtype="int4", symmetric=True, method="mse")
    >>> err = lambda s: float(((gpuq.dequantize(gpuq.quantize(w, s, dtype="int4"), s) - w) ** 2).sum())
    >>> round(float(s1 / s0), 4), round(err(s0), 2), round(err(s1), 2)   # candidate 12: the range * 0.88
    (0.88, 3.11, 2.72)

    MX scales (a power of two per block of 32; compressed-tensors' ``even`` rule by default):

    >>> gpuq.choose_qparams(np.float32([[7.0, 1.0], [1.5, 0.0]]), axis=1, group_size=32,
    ...                     dtype="float4_e2m1fn", scale_dtype="float8_e8m0fnu")
    (array([[2.  ],
           [0.25]], dtype=float32), None)

    The full-range rule: -7.5 reaches the code -8, 7.5 is clamped to 7:

    >>> s, _ = gpuq.choose_qparams(np.float32([-7.5, 3.0]), dtype="int4", symmetric=True, scale_rule="full")
    >>> s, gpuq.unpack(gpuq.quantize(np.float32([-7.5, 3.0, 7.5]), s, dtype="int4"))
    (array(1., dtype=float32), array([-8,  3,  7], dtype=int8))
    """
    rule_given = scale_rule
    backend, arr, scheme, code, symmetric, eps_, sdt, method = validate(
        x, axis, group_size, block_size, dtype, symmetric, eps, scale_dtype, method, scale_rule)
    rule = _scale_rule(rule_given, sdt, code, eps, method, global_scale)
    if rule is not None:
        return _rule_scales(backend, arr, scheme, code, rule, global_scale), None
    return backend.choose_qparams(code, arr, scheme, symmetric, eps_, sdt, method)


@callers_type
def quantize_dynamic(x, *, axis=None, group_size=None, block_size=None, dtype="int8", symmetric=None,
                     scale_dtype="float32", method="minmax", scale_rule=None, global_scale=None,
                     check_values=True):
    """Codes, scales and zero points of ``x`` in one call.

    The same as :func:`choose_qparams` followed by :func:`gpuq.quantize`,
    bit for bit. On the GPU it reads ``x`` at most twice, and once where each
    block is a contiguous row (per-token rows, groups along the last axis):
    one team of threads per block (8 to 32 lanes, or a thread block), the
    block held in registers where its rows are 16-byte aligned whole units of
    16 elements (float16, bfloat16, float32; blocks up to 16384 elements).

    Parameters
    ----------
    x, axis, group_size, dtype, symmetric, scale_dtype, method, scale_rule
        As in :func:`choose_qparams` (``eps`` is the default one). ``method="mse"`` is
        :func:`choose_qparams` with it, then :func:`gpuq.quantize` (no fused pass).
    check_values : bool
        True (default): +/-Inf in ``x``, or a scale that ``scale_dtype`` cannot hold, raises
        ``ValueError`` as in :func:`choose_qparams`; on the GPU that reads one flag back (a
        synchronisation). False: nothing is checked or read back (the call only enqueues work
        on the GPU), and a block holding +/-Inf gets scale +Inf and codes equal to its zero
        point (0 where it has none; fp8 codes: +/-0, and NaN for +/-Inf itself), a scale that
        ``scale_dtype`` cannot hold comes back as 0 or +Inf; the asymmetric zero point of
        either is 0. The same bits on every backend. ``method="mse"`` always checks (its search
        needs every block's range finite).

    Returns
    -------
    q : codes of ``x.shape`` as :func:`gpuq.quantize` returns them (int8/uint8
        arrays, fp8 arrays, :class:`gpuq.Codes` for int4/uint4)
    scales : float32 array
    zps : int32 array, or None (symmetric int8/int4, fp8)

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> x = np.array([[0.5, -1.0, 2.0], [10.0, 20.0, -5.0]], np.float32)
    >>> q, s, z = gpuq.quantize_dynamic(x, axis=0, symmetric=True)
    >>> q
    array([[ 32, -64, 127],
           [ 64, 127, -32]], dtype=int8)
    >>> s, z
    (array([0.01574803, 0.15748031], dtype=float32), None)
    >>> gpuq.quantize_dynamic(x, axis=0, symmetric=True, dtype="int4", method="mse")[1]
    array([0.2742857, 2.742857 ], dtype=float32)

    Unchecked, a row holding Inf is all zero points with scale Inf (checked, a ``ValueError``):

    >>> gpuq.quantize_dynamic(np.float32([[1, np.inf], [2, -4]]), axis=0, dtype="uint8",
    ...                       check_values=False)
    (array([[  0,   0],
           [255,   0]], dtype=uint8), array([       inf, 0.02352941], dtype=float32), array([  0, 170], dtype=int32))
    """
    check_bool(check_values, "check_values")
    backend, arr, scheme, code, symmetric, eps, sdt, method = validate(
        x, axis, group_size, block_size, dtype, symmetric, None, scale_dtype, method, scale_rule)
    rule = _scale_rule(scale_rule, sdt, code, None, method, global_scale)
    if rule is not None:  # MX or NVFP4: the scales by the rule, then quantize (no fused pass)
        scales = _rule_scales(backend, arr, scheme, code, rule, global_scale)
        q = quantize(arr, scales, axis=axis, group_size=group_size, block_size=block_size, dtype=code.name,
                     check_values=False, global_scale=global_scale)
        return q, scales, None
    if method == "minmax":
        fused = backend.quantize_dynamic(code, arr, scheme, symmetric, eps, sdt, check_values)  # one pass where the backend can
        if fused is not None:
            return fused
        scales, zps = backend.choose_qparams(code, arr, scheme, symmetric, eps, sdt, method, check_values)
    else:
        scales, zps = backend.choose_qparams(code, arr, scheme, symmetric, eps, sdt, method)
    # The parameters are gpuq's own: no second check (unchecked ones may hold a scale +Inf).
    return computed_codes(backend, arr, scheme, code, scales, zps), scales, zps


def computed_codes(backend, arr, scheme, code, scales, zps):
    """The codes of ``arr`` from float32 ``scales`` and int32 ``zps`` (or None) that gpuq
    computed for it (``scheme.param_shape``): :func:`gpuq.api.encode` with the scales in the
    compute type (float64 for float64 data, widened exactly); the zero points of a code type
    without them (fp8: all 0) are left out."""
    ct = compute_dtype(native(arr.dtype))
    z = None if zps is None or code.zero_point == "none" else zps
    return encode(backend, arr, scheme, code, scales.astype(ct, copy=False), z)




def _rule_scales(backend, arr, scheme, code, rule, global_scale):
    """The scales of a scale rule from the backend's block min/max: MX's powers of two, or
    NVFP4's e4m3 block scales (as float32)."""
    from ._dtypes import dtype_name

    lo, hi = backend.minmax(arr, scheme)
    if rule == "nvfp4":
        return _nvfp4.nvfp4_scales(lo, hi, _nvfp4.check_global_scale(global_scale), dtype_name(arr.dtype))
    return _mx.mx_scales(lo, hi, code.name, rule)
