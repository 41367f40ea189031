"""fp8, packed int4/uint4, fp6 and packed fp4 on the GPU: launches of kernels/formats.cu.

Called by :class:`gpuq.backends.cuda.backend.CudaBackend` for the rows of these codes.
Parameters, index maps, streams and devices follow the int8 kernels
(:mod:`gpuq.backends.cuda.launch`): one
launch per call, a single host parameter passed by value, non-contiguous src
copied once, a non-contiguous out written through a contiguous temporary.

* fp8 runs the int8 kernels' traversal (16-element units after a scalar head
  that aligns the float side): codes are one byte each.
* int4 units are 16 elements from an even element, 8 whole packed bytes: no
  head (it could be odd), 16-byte vectors on the float side where src is
  aligned, 8-byte words on the packed side where the bytes are.

>>> import cupy, gpuq                                    # doctest: +SKIP
>>> gpuq.quantize(cupy.asarray([1.0, -2.0, 3.0], cupy.float32), 1.0, dtype="int4").data  # doctest: +SKIP
array([225,   3], dtype=uint8)
"""

from __future__ import annotations

import numpy as np

from . import registry
from .launch import THREADS, alignment, cupy_module, get_function, grid, map_args

_SOURCE = "formats.cu"


def _contiguous(src, out, launch):
    """``launch(x, y)`` on contiguous forms of src/out under src's device (out copied back)."""
    cupy = cupy_module()
    with src.device:
        x = src if src.flags.c_contiguous else cupy.ascontiguousarray(src)
        y = out if out.flags.c_contiguous else cupy.empty(out.shape, out.dtype)
        launch(x, y)
        if y is not out:
            out[...] = y


def _launch_elementwise(name, group, src, out, float_arr, code_arr, scheme, scales, *extra):
    cupy = cupy_module()
    n = src.size
    map_name, (m0, m1, m2), dims_arg, s, _ = map_args(src, scheme, scales, None)
    fn = get_function(_SOURCE, group, name(map_name))
    head, vec = alignment(float_arr, code_arr, n)
    units = 1 + -(-(n - head) // 16)
    args = (src, out, s, s, np.int64(n), np.int64(head), np.int32(vec), np.int64(m0), np.int64(m1),
            np.int64(m2), dims_arg, *extra)
    fn((grid(units),), (THREADS,), args, stream=cupy.cuda.get_current_stream())


def quantize_fp8(src, scheme, scales, out_bits, code, saturate) -> None:
    """fp8 bits (code dtype ``code``) of device ``src`` into ``out_bits`` (uint8, src's shape)."""
    group = registry.formats_group("quantize", src.dtype, code)

    def launch(x, y):
        _launch_elementwise(lambda m: registry.quantize_fp8_name(x.dtype, code, m), group,
                            x, y, x, y, scheme, scales, np.int32(bool(saturate)))

    _contiguous(src, out_bits, launch)


def dequantize_fp8(bits, scheme, scales, out, code) -> None:
    """``out = widen(bits) * s`` for fp8 bits of code dtype ``code`` (uint8, out's shape)."""
    group = registry.formats_group("dequantize", out.dtype, code)

    def launch(q, y):
        _launch_elementwise(lambda m: registry.dequantize_fp8_name(code, y.dtype, m), group,
                            q, y, y, q, scheme, scales)

    _contiguous(bits, out, launch)


def _int4_vec(float_arr, packed) -> int:
    vec = 1 if float_arr.data.ptr % 16 == 0 else 0  # kVecFloat: every unit starts 16 elements on
    if packed.data.ptr % 8 == 0:
        vec |= 2  # kVecPacked: 8 bytes per unit
    return vec


def _launch_int4(name, group, src, out, float_arr, packed, scheme, scales, zps):
    cupy = cupy_module()
    n = float_arr.size
    has_zp = zps is not None
    map_name, (m0, m1, m2), dims_arg, s, z = map_args(float_arr, scheme, scales, zps)
    fn = get_function(_SOURCE, group, name(has_zp, map_name))
    units = -(-n // 16)
    args = (src, out, s, z if has_zp else s, np.int64(n), np.int32(_int4_vec(float_arr, packed)),
            np.int64(m0), np.int64(m1), np.int64(m2), dims_arg)
    fn((grid(units),), (THREADS,), args, stream=cupy.cuda.get_current_stream())


def quantize_int4(src, scheme, scales, zps, packed, signed) -> None:
    """Packed int4/uint4 codes of device ``src`` into ``packed`` (1-D uint8, ceil(n/2))."""
    code = "int4" if signed else "uint4"
    cupy = cupy_module()
    with src.device:
        x = src if src.flags.c_contiguous else cupy.ascontiguousarray(src)
        group = registry.formats_group("quantize", x.dtype, code)
        _launch_int4(lambda z, m: registry.quantize_int4_name(x.dtype, signed, z, m), group,
                     x, packed, x, packed, scheme, scales, zps)


def dequantize_int4(packed, scheme, scales, zps, out, signed) -> None:
    """``out = (q - zp) * s`` for the packed int4/uint4 codes ``packed`` (out's shape)."""
    code = "int4" if signed else "uint4"
    cupy = cupy_module()
    with out.device:
        y = out if out.flags.c_contiguous else cupy.empty(out.shape, out.dtype)
        group = registry.formats_group("dequantize", y.dtype, code)
        _launch_int4(lambda z, m: registry.dequantize_int4_name(signed, y.dtype, z, m), group,
                     packed, y, y, packed, scheme, scales, zps)
        if y is not out:
            out[...] = y


def quantize_mini(src, scheme, scales, out, code) -> None:
    """fp6 bits (uint8, src's shape) or packed fp4 bytes (1-D, ceil(n/2)) of device ``src``:
    fp6 runs fp8's launch, fp4 int4's (no zero points)."""
    if registry.MINI_FMT[code] == 0:
        cupy = cupy_module()
        with src.device:
            x = src if src.flags.c_contiguous else cupy.ascontiguousarray(src)
            group = registry.formats_group("quantize", x.dtype, code)
            _launch_int4(lambda z, m: registry.quantize_mini_name(x.dtype, code, m), group,
                         x, out, x, out, scheme, scales, None)
        return
    group = registry.formats_group("quantize", src.dtype, code)

    def launch(x, y):
        _launch_elementwise(lambda m: registry.quantize_mini_name(x.dtype, code, m), group,
                            x, y, x, y, scheme, scales)

    _contiguous(src, out, launch)


def dequantize_mini(codes, scheme, scales, out, code) -> None:
    """``out = value(q) * s`` for fp6 bits (out's shape) or packed fp4 bytes ``codes``."""
    group = registry.formats_group("dequantize", out.dtype, code)
    if registry.MINI_FMT[code] == 0:
        cupy = cupy_module()
        with out.device:
            y = out if out.flags.c_contiguous else cupy.empty(out.shape, out.dtype)
            _launch_int4(lambda z, m: registry.dequantize_mini_name(code, y.dtype, m), group,
                         codes, y, y, codes, scheme, scales, None)
            if y is not out:
                out[...] = y
        return

    def launch(q, y):
        _launch_elementwise(lambda m: registry.dequantize_mini_name(code, y.dtype, m), group,
                            q, y, y, q, scheme, scales)

    _contiguous(codes, out, launch)
