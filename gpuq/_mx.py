"""OCP Microscaling (MX) scales: a power of two per block, chosen by one of four rules.

With ``amax = max|x|`` of a block (NaN skipped, float64 data's amax rounded to float32),
``amax = (1 + f) * 2**e`` and ``emax`` the exponent of the element type's largest power of two
(:data:`EMAX`), the scale is ``2**k``:

* ``floor``: ``k = e - emax`` (OCP v1.0 section 6.3; torchao's default);
* ``even`` (default): ``k = e + [f >= 1 - 2**-(m+1)] - emax``, ``m`` from :data:`EVEN_M`
  (compressed-tensors 0.20's table: 1 for fp4 and e4m3, 3 for e2m3; the element's mantissa
  bits for e3m2 and e5m2, which compressed-tensors does not have);
* ``ceil``: ``k = ceil(log2(amax)) - emax`` (torchao CEIL);
* ``rceil``: ``k = ceil(log2(float32(amax / max)))`` (NVIDIA's conversion, torchao RCEIL).

``k`` is clamped to [-127, 127]; a block whose amax is 0 gets ``2**-127`` (byte 0x00). The scales
are float32 holding exactly ``2**k`` (``2**-127`` is a float32 subnormal). The min/max is the
backend's (a kernel on the device); the rule is parameter-sized NumPy arithmetic, its result
uploaded to the device for device arrays.

>>> import numpy as np
>>> amax = np.float32([0, 1, 1.5, 1.75, 7, 6])
>>> [mx_exponents(amax, "float4_e2m1fn", r).tolist() for r in RULES]
[[-127, -2, -2, -2, 0, 0], [-127, -2, -2, -1, 1, 0], [-127, -2, -1, -1, 1, 1], [-127, -2, -2, -1, 1, 0]]
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["RULES", "EMAX", "EVEN_M", "mx_exponents", "mx_scales", "e8m0_bytes", "e8m0_scales"]

#: The MX values of ``scale_rule`` (``scale_dtype="float8_e8m0fnu"``); the default first after it.
RULES = ("floor", "even", "ceil", "rceil")
DEFAULT_RULE = "even"
#: The exponent of each element type's largest power of two.
EMAX = {"float4_e2m1fn": 2, "float6_e2m3fn": 2, "float6_e3m2fn": 4, "float8_e4m3fn": 8, "float8_e5m2": 15}
#: ``m`` of the ``even`` rule (compressed-tensors 0.20's where it has the type).
EVEN_M = {"float4_e2m1fn": 1, "float8_e4m3fn": 1, "float6_e2m3fn": 3, "float6_e3m2fn": 2, "float8_e5m2": 2}


def _device_round_trip(fn):
    """``fn`` on NumPy arrays; CuPy arguments go to the host and the result back to their device.
    The arrays are parameter-sized (one value per block), and the Inf check reads them anyway."""
    import functools
    import sys

    @functools.wraps(fn)
    def call(*args):
        cupy = sys.modules.get("cupy")
        dev = next((a for a in args if cupy is not None and isinstance(a, cupy.ndarray)), None)
        if dev is None:
            return fn(*args)
        with dev.device:
            host = [cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else a for a in args]
            return cupy.asarray(fn(*host))

    return call


def mx_exponents(amax, code: str, rule: str):
    """``k`` (int32) of each float32 ``amax`` (finite, >= 0, NumPy) for element type ``code``
    and ``rule``, read from amax's float32 bits (one pass each; no frexp)."""
    bits = np.asarray(amax, np.float32).view(np.int32)
    mant = bits & np.int32(0x7FFFFF)  # f * 2**23
    # e of amax = (1 + f) * 2**e; a subnormal amax reads as e = -127, which every rule clamps to
    # -127 anyway (emax >= 2).
    e = (bits >> 23) - np.int32(127)
    emax = np.int32(EMAX[code])
    if rule == "floor":
        k = e - emax
    elif rule == "even":  # f >= 1 - 2**-(m+1)
        k = e + (mant >= np.int32(2**23 - 2 ** (22 - EVEN_M[code]))) - emax
    elif rule == "ceil":
        k = e + (mant != 0) - emax
    else:  # rceil: ceil(log2) of the float32 quotient by the element's max
        from ._codetypes import CODE_TYPES

        quot = np.asarray(amax / np.float32(CODE_TYPES[code].qmax), np.float32)
        qbits = quot.view(np.int32)
        k = (qbits >> 23) - np.int32(127) + ((qbits & np.int32(0x7FFFFF)) != 0)
        sub = (qbits >> 23) == 0  # a subnormal quotient: its ceil(log2) can still be -126
        if bool(sub.any()):
            mq, eq = np.frexp(quot[sub])
            # A quotient that underflows to 0 has log2 = -inf: the smallest scale.
            k[sub] = np.where(quot[sub] == 0, np.int32(-127), eq.astype(np.int32) - 1 + (mq * np.float32(2) > 1))
    k = np.clip(k, -127, 127).astype(np.int32, copy=False)
    return np.where(bits == 0, np.int32(-127), k).astype(np.int32, copy=False)


def _pow2(k):
    """float32 ``2**k`` of int32 ``k`` in [-127, 127], built from its bits (2**-127 subnormal)."""
    return np.where(k == -127, np.int32(0x400000), (k + np.int32(127)) << 23).astype(np.int32).view(np.float32)


@_device_round_trip
def mx_scales(lo, hi, code: str, rule: str):
    """float32 ``2**k`` of each block from its (NaN-skipping) min ``lo`` and max ``hi``; +/-Inf
    (or a float64 value beyond float32) is a ``ValueError``."""
    lo32, hi32 = lo.astype(np.float32), hi.astype(np.float32)
    amax = np.fmax(np.fmax(hi32, -lo32), np.float32(0))  # a block of NaN only: 0
    if bool(np.isinf(amax).any()):
        raise ValueError("x must be finite (and within float32) to choose quantization parameters, "
                         "got +/-inf (no power-of-two scale covers it)")
    k = mx_exponents(amax, code, rule)
    return _pow2(k)


@_device_round_trip
def e8m0_bytes(scales):
    """The e8m0 bytes (uint8, ``k + 127``) of float32 scales holding exactly ``2**k``,
    k in [-127, 127]; a NaN scale gives 0xFF. Anything else is a ``ValueError``.

    >>> import numpy as np, gpuq
    >>> gpuq.e8m0_bytes(np.float32([1.0, 0.25, 2.0**-127, 2.0**127, np.nan])).tolist()
    [127, 125, 0, 254, 255]
    >>> gpuq.e8m0_bytes(np.float32([3.0]))
    Traceback (most recent call last):
    ...
    ValueError: scales must be powers of two 2**k, k in [-127, 127] (or NaN), got 3.0 at index (0,)
    """
    dt = getattr(scales, "dtype", None)
    if dt is None or dt.kind != "f":
        raise TypeError(f"scales must be a float array (float32 powers of two), got "
                        f"{type(scales).__qualname__} of dtype {dt}")
    s = scales.astype(np.float32)
    mant, ex = np.frexp(s)
    k = ex.astype(np.int32) - 1
    nan = np.isnan(s)
    ok = nan | ((mant == np.float32(0.5)) & (k >= -127) & (k <= 127))
    if not bool(ok.all()):
        i = np.unravel_index(int(np.argmin(ok)), ok.shape)
        value = s[i]
        where = f" at index {tuple(int(j) for j in i)}" if ok.ndim else ""
        raise ValueError(f"scales must be powers of two 2**k, k in [-127, 127] (or NaN), got {value}{where}")
    return np.where(nan, np.int32(255), k + 127).astype(np.uint8)


@_device_round_trip
def e8m0_scales(data):
    """float32 scales ``2**(b - 127)`` of e8m0 bytes (uint8, or ml_dtypes' ``float8_e8m0fnu``);
    byte 0xFF gives NaN (which ``dequantize`` refuses, as every non-finite scale).

    >>> import numpy as np, gpuq
    >>> gpuq.e8m0_scales(np.uint8([127, 125, 0, 255])).tolist()[:3]
    [1.0, 0.25, 5.877471754111438e-39]
    """
    dt = getattr(data, "dtype", None)
    if dt is not None and dt.name == "float8_e8m0fnu":
        data = data.view(np.uint8)
    elif dt != np.uint8:
        raise TypeError(f"data must be a uint8 (or ml_dtypes float8_e8m0fnu) array of e8m0 bytes, got "
                        f"{type(data).__qualname__} of dtype {dt}")
    nan = data == 255
    k = np.where(nan, 0, data.astype(np.int32) - 127)  # (2**128 would overflow: NaN below)
    out = np.asarray(np.ldexp(np.float32(1), k), np.float32)
    return np.where(nan, np.float32(np.nan), out).astype(np.float32)


@functools.cache
def mx_rule_table(code: str, rule: str) -> tuple:
    """OCP MX's rule (:func:`gpuq.mx_exponents`, the one statement of it) as the pass reads
    it: ``(first, step, values)``, where the e8m0 byte of a finite ``amax >= 0`` with float32
    bits ``a`` is ``first[a >> 23] + (a >= step[a >> 23])`` and its scale ``values[byte]``.

    Every rule's ``k`` rises with amax and takes at most two values within one binade (``k``
    follows amax's exponent, or ``log2`` of amax over a constant), so each exponent field has a
    first byte and the first bits where the second begins, found here by bisection on
    ``mx_exponents`` itself (checked: the ends of each binade differ by 0 or 1).

    >>> first, step, values = mx_rule_table("float4_e2m1fn", "even")
    >>> a = np.float32(1.75).view(np.uint32)   # 1.75 = 1.75 * 2**0, even rounds up: 2**-1
    >>> b = first[a >> 23] + (a >= step[a >> 23]); int(b), float(values[b])
    (126, 0.5)
    """
    def byte(b):
        return mx_exponents(b.view(np.float32), code, rule) + 127

    field = np.arange(255, dtype=np.uint32) << np.uint32(23)  # the finite exponent fields
    lo, hi = byte(field), byte(field | np.uint32(0x7FFFFF))
    if not ((hi - lo >= 0) & (hi - lo <= 1)).all():
        raise AssertionError(f"gpuq internal error: the MX rule {rule!r} is not monotonic in two steps a binade")
    a, b = np.zeros(255, np.uint32), np.full(255, 0x7FFFFF, np.uint32)
    while (a < b).any():  # the first mantissa whose byte is hi's (b's byte is hi's throughout)
        mid = (a + b) // 2
        up = byte(field | mid) == hi
        b, a = np.where(up, mid, b), np.where(up, a, mid + 1)
    step = np.where(hi > lo, field | b, np.uint32(0xFFFFFFFF)).astype(np.uint32)
    first = np.append(lo, 0).astype(np.uint8)  # field 255 (Inf/NaN) is never read: amax is finite
    values = e8m0_scales(np.arange(256, dtype=np.uint8))
    return first, np.append(step, np.uint32(0xFFFFFFFF)), values
