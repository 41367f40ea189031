"""gpt-oss's MXFP4 expert tensors as arrays: decoded to the dense ``[E, in, out]`` tensor and
encoded from it, one expert at a time.

The published layout (``openai/gpt-oss-20b``): ``P_blocks`` uint8 ``[E, out, in/32, 16]`` and
``P_scales`` uint8 ``[E, out, in/32]``. Row ``o`` of expert ``e`` is the weight row ``[out, in]``
in groups of 32 inputs; byte ``j`` of group ``g`` holds input ``32g + 2j`` in its low nibble and
``32g + 2j + 1`` in its high nibble (e2m1 codes, sign in bit 3), and scale byte ``b`` means
``2**(b - 127)`` (e8m0; 255 is NaN, refused). The dense tensor transformers builds
(``convert_moe_packed_tensors``) is the transpose, ``[E, in, out]``: gpt-oss computes ``x @ W``.

Decoding follows gpuq's contract (:func:`gpuq.dequantize`): each value is the float32 product
``e2m1(code) * 2**(b - 127)`` rounded once to the output dtype. The product has at most two
significant bits, so it is exact in float32 and bfloat16 up to 2**127 and above 2**-133; beyond
that, bfloat16 and float32 overflow to +/-inf alike and float16 rounds as any float16 output does.
So the whole decode is a table of 256 x 16 output values, indexed by (scale byte, code): the
compiled loop (numba, where :func:`gpuq.get_host_kernels` says it serves) reads each byte once,
looks its two values up at once (:func:`pair_table`) and writes them straight into their
transposed places, with no temporary; the NumPy loop does the same through fancy indexing, one
expert at a time.

>>> import numpy as np
>>> blocks = np.zeros((1, 2, 1, 16), np.uint8); blocks[0, 1, 0, 0] = 0x72   # inputs 0, 1 of row 1
>>> scales = np.full((1, 2, 1), 128, np.uint8)                            # 2**1
>>> y = dequantize_experts(blocks, scales, "float32")
>>> y.shape, y[0, :2, 1].tolist(), y[0, :2, 0].tolist()
((1, 32, 2), [2.0, 12.0], [0.0, 0.0])
"""

from __future__ import annotations

import functools
import sys

import numpy as np

#: Inputs per scale (the MX block) and bytes per block.
GROUP, BLOCK_BYTES = 32, 16
#: The e8m0 byte that is NaN: no scale of a weight.
NAN_SCALE = 255
#: The e2m1 values of codes 0..15 (bit 3 the sign; code 8 is -0.0).
E2M1 = np.float32([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
#: Unsigned integers of each output itemsize: the compiled loop copies values as bits.
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@functools.lru_cache(maxsize=None)
def value_table(dtype_name: str) -> np.ndarray:
    """``[256, 16]`` bits (an unsigned view) of ``dtype(float32(e2m1[c]) * float32(2**(s - 127)))``
    for scale byte ``s`` and code ``c``; row 255 (NaN) is NaN, never read (those scales are refused).

    >>> t = value_table("bfloat16")
    >>> t.dtype, hex(t[127, 7]), hex(t[127, 8])                  # 6.0 and -0.0 at scale 1
    (dtype('uint16'), '0x40c0', '0x8000')
    """
    from ..convert import float_dtype

    out = float_dtype(dtype_name)
    k = np.arange(256, dtype=np.int32) - 127
    k[NAN_SCALE] = 0
    scale = np.ldexp(np.float32(1), k).astype(np.float32)
    with np.errstate(over="ignore"):
        prod = (scale[:, None] * E2M1[None, :]).astype(np.float32)
    prod[NAN_SCALE] = np.nan
    table = prod.astype(out).view(_BITS[out.itemsize])
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=None)
def pair_table(dtype_name: str) -> np.ndarray:
    """``[256, 256]``: for scale byte ``s`` and block byte ``b``, the bits of the values of its
    low and high nibble (:func:`value_table`) side by side, the low one in the low half of an
    integer twice as wide (2- and 4-byte outputs).

    >>> hex(pair_table("bfloat16")[127, 0x72])                     # 1.0 (low nibble: code 2), 6.0
    '0x40c03f80'
    """
    t = value_table(dtype_name)
    wide, byte = _BITS[2 * t.itemsize], np.arange(256)
    pairs = t[:, byte & 15].astype(wide) | (t[:, byte >> 4].astype(wide) << wide(8 * t.itemsize))
    pairs.flags.writeable = False
    return pairs


def check_arrays(blocks, scales, name: str = "blocks", first: int = 0) -> tuple:
    """``(E, out, groups)`` of a blocks/scales pair in the published layout; ValueError naming
    ``name`` for anything else, or for a scale byte 255 (NaN: no scale of a weight; ``first`` is
    the number of the first expert, for a slice).

    >>> check_arrays(np.zeros((2, 3, 4, 16), np.uint8), np.zeros((2, 3, 4), np.uint8))
    (2, 3, 4)
    >>> check_arrays(np.zeros((2, 3, 4, 16), np.uint8), np.full((2, 3, 4), 255, np.uint8), "m.down_proj")
    Traceback (most recent call last):
    ...
    ValueError: m.down_proj: scale byte 255 (NaN) at expert 0, row 0, group 0: an e8m0 scale of a weight is 0..254
    """
    for what, arr, rank in (("blocks", blocks, 4), ("scales", scales, 3)):
        dt = getattr(arr, "dtype", None)
        if not isinstance(arr, np.ndarray) or dt != np.uint8 or arr.ndim != rank:
            raise ValueError(f"{name}: {what} must be a uint8 NumPy array of rank {rank}, got "
                             f"{type(arr).__name__} of dtype {dt} and shape {getattr(arr, 'shape', None)}")
    if blocks.shape[-1] != BLOCK_BYTES or blocks.shape[:3] != scales.shape:
        raise ValueError(f"{name}: blocks {list(blocks.shape)} and scales {list(scales.shape)} are not "
                         f"[E, out, in/32, 16] and [E, out, in/32]")
    bad = np.flatnonzero(scales.reshape(-1) == NAN_SCALE)
    if bad.size:
        e, o, g = np.unravel_index(int(bad[0]), scales.shape)
        raise ValueError(f"{name}: scale byte 255 (NaN) at expert {first + e}, row {o}, group {g}: an e8m0 "
                         f"scale of a weight is 0..254")
    return scales.shape


def dequantize_experts(blocks, scales, dtype="bfloat16", *, out=None, name: str = "blocks", first: int = 0):
    """The dense ``[E, in, out]`` tensor of gpt-oss MXFP4 ``blocks`` ``[E, out, in/32, 16]`` and
    ``scales`` ``[E, out, in/32]`` (uint8 NumPy arrays; see the module docstring), in ``dtype``
    (bfloat16, float16, float32 or float64). For bfloat16 it is bit for bit transformers'
    ``convert_moe_packed_tensors(blocks, scales)``. ``out``: a C-contiguous array of that shape
    and dtype to write into (the only memory the call takes; a slice of experts may be passed
    with the matching slices of ``blocks`` and ``scales``). ``name`` names the tensor in errors,
    ``first`` the number of its first expert there.

    >>> import numpy as np
    >>> blocks = np.full((2, 3, 1, 16), 0x21, np.uint8)          # every pair: 0.5, then 1.0
    >>> y = dequantize_experts(blocks, np.full((2, 3, 1), 126, np.uint8), "float32")
    >>> y.shape, y[1, :4, 2].tolist()
    ((2, 32, 3), [0.25, 0.5, 0.25, 0.5])
    """
    from ..convert import float_dtype

    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a dtype name (bfloat16, float16, float32, float64), got {dtype!r}")
    E, rows, groups = check_arrays(blocks, scales, name, first)
    want = (E, groups * GROUP, rows)
    dt = float_dtype(dtype)
    if out is None:
        out = np.empty(want, dt)
    elif not (isinstance(out, np.ndarray) and out.shape == want and out.dtype == dt
              and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{name}: out must be a writable C-contiguous {dt.name} array of shape "
                         f"{list(want)}, got {type(out).__name__} {getattr(out, 'dtype', None)} "
                         f"{list(getattr(out, 'shape', ()))}")
    _decode(np.ascontiguousarray(blocks), np.ascontiguousarray(scales), dt, out.view(_BITS[dt.itemsize]))
    return out


def _decode(blocks, scales, dt, bits) -> None:
    """Decode every expert into ``bits`` (the output's unsigned view), compiled where it serves
    (2- and 4-byte outputs: float64 takes the NumPy loop)."""
    import gpuq

    E = blocks.shape[0]
    if gpuq.get_host_kernels() != "numba" or dt.itemsize > 4:
        for e in range(E):
            _decode_numpy(blocks[e], scales[e], value_table(dt.name), bits[e])
        return
    from . import _gpt_oss_loops

    pairs, shift = pair_table(dt.name), 8 * dt.itemsize
    # Touch a fresh output's pages in order first: faulted in by the loop's 32-row bands on two
    # threads they cost 4-5 s per GiB on the test VM (0.3 s in order; bench/NOTES.md).
    bits.reshape(-1)[:: 4096 // dt.itemsize] = 0
    # Threads split the work by (expert, group) runs: each writes its own 32-row bands.
    units = E * blocks.shape[2]
    threads = max(1, min(gpuq.get_num_threads(), units, blocks.size // (1 << 16) + 1))
    cuts = [units * i // threads for i in range(threads + 1)]
    if dt.itemsize == 2 and blocks.shape[1] % 4 == 0 and sys.byteorder == "little":
        # Four rows per 8-byte store (bfloat16, float16: gpt-oss's case).
        args = (blocks.view(np.uint64), scales, pairs, bits.view(np.uint64))
        loop = _gpt_oss_loops.decode_x4
    else:
        args, loop = (blocks, scales, pairs, bits, shift), _gpt_oss_loops.decode
    if threads == 1:
        loop(*args, 0, units)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads - 1) as pool:
        futures = [pool.submit(loop, *args, cuts[i], cuts[i + 1]) for i in range(1, threads)]
        loop(*args, cuts[0], cuts[1])
        for f in futures:
            f.result()


def _decode_numpy(blocks, scales, table, bits) -> None:
    """One expert: ``bits[in, out]`` from ``blocks[out, G, 16]`` and ``scales[out, G]``, in runs
    of rows so the index temporaries stay a few MiB."""
    rows, groups, _ = blocks.shape
    step = max(1, (1 << 18) // (groups * BLOCK_BYTES))
    for r0 in range(0, rows, step):
        b = blocks[r0:r0 + step]
        t = table[scales[r0:r0 + step]]                       # [rows, G, 16] values of each code
        pair = np.empty(b.shape + (2,), bits.dtype)
        pair[..., 0] = np.take_along_axis(t, (b & 15).astype(np.intp), axis=2)
        pair[..., 1] = np.take_along_axis(t, (b >> 4).astype(np.intp), axis=2)
        bits[:, r0:r0 + step] = pair.reshape(len(b), groups * GROUP).T
