"""The one-pass checkpoint weight on the GPU: the launch of ``kernels/weight_pass.cu``.

:func:`plan` fixes a weight's launch (kernel, grid, code range) from its shape, stored dtype
and scheme; :func:`enqueue` puts it on CuPy's current stream: the per-tensor range first where
there is one scale for the whole weight, then one ``weight_pass`` launch that writes the
scales, the codes in their final layout (compressed-tensors' uint32 words, or fp8 bytes), and
one partial of the figures per block; :func:`figures` adds the partials on the host in block
order. The grid depends on the shape alone (at most :data:`MAX_BLOCKS` blocks), never on the
GPU, so the figures are the same bits on every GPU; they are the host pass's sums in another
order (the report's SQNR may differ in its last printed digit). Codes and scales are the host
pass's (:mod:`gpuq.backends.host.weight_pass`), bit for bit.

No CuPy import at module level.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .qparams import KEY_NEG_INF, KEY_POS_INF, SCALE_FMT
from .registry import (FP8_FMT, MINI_FMT, weight_blocks_name, weight_micro_name, weight_pass_group, weight_pass_name,
                       weight_range_name)

SOURCE = "weight_pass.cu"
THREADS = 256
#: Most blocks of a launch: the figures' partials (3 float64 and 3 int64 each) are this many at most.
MAX_BLOCKS = 1024
#: Groups of at most this many elements go to one warp (the kernels' WARP), longer ones to a block.
WARP_GROUP = 512
_NULL = np.uint64(0)  # no zero points (symmetric): a null pointer, as gpuq.backends.cuda.mse passes it
#: The dtypes the kernels read, by their storage (bfloat16 arrives as its bits).
_DTYPES = {"bfloat16", "float16", "float32"}


class Plan(NamedTuple):
    """One weight's launch: see :func:`plan`."""

    dtype: str        # the stored dtype's name
    rows: int
    n: int
    g: int
    kind: int         # 0 integer words, 1 + FP8_FMT
    cbits: int        # bits of an integer code (8 for fp8: a byte each)
    qmin: int
    qmax: int
    symmetric: int    # 0, 1, or 2 (the full-range rule)
    eps: float
    fmt: int          # the scale dtype's number (kernels/qparams.cu round_scale)
    tensor: bool
    warp: bool
    blocks: int
    given: bool = False  # the scales (and zps) are the caller's: uploaded, read as they are
    block: tuple | None = None  # fine-grained fp8: (rows, columns) of a scale's block
    micro: tuple | None = None  # microscaling (kind MICRO): (mfmt, mode, parameters' head bytes)

    @property
    def out_shape(self) -> tuple:
        """The codes' host shape: uint32 words a row for integer codes, bytes for fp8 (and for
        fp4/fp6: ``n * bits / 8`` a row)."""
        if self.kind == MICRO:
            return (self.rows, self.n * self.cbits // 8)
        return (self.rows, -(-self.n * self.cbits // 32)) if self.kind == 0 else (self.rows, self.n)

    @property
    def out_dtype(self):
        return np.dtype(np.uint32 if self.kind == 0 else np.uint8)

    @property
    def params_bytes(self) -> int:
        """Bytes of the parameters' buffer: float32 scales and int32 zps, or, for microscaling,
        :data:`MICRO_HEAD` then one scale byte a group."""
        return MICRO_HEAD + self.slots if self.kind == MICRO else 8 * self.slots

    @property
    def slots(self) -> int:
        if self.block is not None:
            return -(-self.rows // self.block[0]) * -(-self.n // self.block[1])
        return 1 if self.tensor and self.kind != MICRO else self.rows * (self.n // self.g)


def plan(shape, dtype: str, code, symmetric, eps, scale_dtype: str, g: int, tensor: bool, given: bool = False) -> Plan:
    """The launch of a C-order ``shape`` = ``[rows, n]`` weight stored as ``dtype`` (a name) in
    ``code`` (a ``gpuq._codetypes`` row: int4/int8, or fp8), ``symmetric``/``eps``/``scale_dtype``
    as ``gpuq._qoptions.validate`` gives them, groups of ``g`` (``n`` per channel or tensor);
    ``given``: the scales (and zero points) are the caller's (the MSE search's, MX's e8m0 ones:
    any scale dtype), which the kernel reads as they are.

    >>> from gpuq._codetypes import code_type
    >>> p = plan((4, 256), "bfloat16", code_type("int4"), 2, 1e-38, "bfloat16", 128, False)
    >>> p.kind, p.warp, p.blocks, p.out_shape
    (0, True, 1, (4, 32))
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} for the weight pass, got {dtype!r}")
    rows, n = (int(d) for d in shape)
    if code.codec == "float8":
        kind, cbits = 1 + FP8_FMT["float8_" + code.fp8], 8
    elif code.codec == "affine" and code.bits in (4, 8) and code.qmin < 0:
        kind, cbits = 0, code.bits
    else:
        raise ValueError(f"code must be int4, int8 or fp8 for the weight pass, got {code.name!r}")
    if n % g or (kind == 0 and g != n and g % (32 // cbits)):
        raise ValueError(f"group_size {g} must divide the rows of {n} and start each group on a word")
    warp = g <= WARP_GROUP
    teams = rows * (n // g)
    per_block = THREADS // 32 if warp else 1
    blocks = max(1, min(-(-teams // per_block), MAX_BLOCKS))
    return Plan(dtype, rows, n, g, kind, cbits, int(code.qmin), int(code.qmax), int(symmetric), float(eps),
                0 if given else SCALE_FMT[scale_dtype], bool(tensor), warp, blocks, bool(given))


#: Plan.kind of the microscaling kernel (weight_micro).
MICRO = 3
#: The microscaling parameters' head (uploaded): MX's rule table (first: 256 bytes, step: 256
#: uint32, values: 256 float32), then NVFP4's global scale (float32: given, or written back);
#: the scale bytes (one a group) follow it.
MICRO_HEAD = 256 * 9 + 4
_MICRO_GS = 256 * 9


def plan_micro(shape, dtype: str, code, g: int, *, mx_table=None, global_scale=None, nvfp4=False) -> Plan:
    """The launch of a C-order ``[rows, n]`` weight stored as ``dtype`` (a name) in fp4/fp6
    ``code`` with one scale a group of ``g`` (16 or 32) along a row, chosen in the kernel from
    the group's finite ``max |x|``: OCP MX's e8m0 bytes by ``mx_table`` (one rule's
    :func:`gpuq._mx.mx_rule_table`), or, ``nvfp4``, NVFP4's e4m3 block scales under
    ``global_scale`` (a float32: a merged layer's), or, where that is None, under the weight's
    own, computed on the GPU after a range reduction (the host pass's
    :func:`~gpuq.backends.host.weight_pass.quantize_micro` and :func:`gpuq.global_scale`, bit for bit).

    >>> from gpuq._codetypes import code_type
    >>> p = plan_micro((4, 64), "float16", code_type("float4_e2m1fn"), 16, nvfp4=True)
    >>> p.kind, p.tensor, p.slots, p.out_shape
    (3, True, 16, (4, 32))
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} for the weight pass, got {dtype!r}")
    if code.name not in MINI_FMT or (nvfp4 and code.bits != 4):
        raise ValueError(f"code must be fp4 or fp6 (NVFP4: fp4) for the microscaling pass, got {code.name!r}")
    if nvfp4 == (mx_table is not None):
        raise ValueError("the microscaling pass takes mx_table= (MX) or nvfp4=True (NVFP4): exactly one")
    rows, n = (int(d) for d in shape)
    if g not in (16, 32) or n % g:
        raise ValueError(f"group_size {g} must be 16 or 32 and divide the rows of {n}")
    head = np.zeros(MICRO_HEAD, np.uint8)
    if mx_table is not None:
        first, step, values = mx_table
        head[:256] = first
        head[256:1280].view(np.uint32)[:] = step
        head[1280:2304].view(np.float32)[:] = values
    mode = 0 if not nvfp4 else (1 if global_scale is None else 2)
    if mode == 2:
        head[_MICRO_GS:].view(np.float32)[0] = np.float32(global_scale)
    blocks = max(1, min(-(-(rows * n) // THREADS), MAX_BLOCKS))
    return Plan(dtype, rows, n, g, MICRO, code.bits, int(code.qmin), int(code.qmax), 1, 0.0, SCALE_FMT[dtype],
                mode == 1, False, blocks, False, None, (MINI_FMT[code.name], mode, head))


def micro_results(params: np.ndarray, p: Plan) -> tuple:
    """``(scale_bytes, global_scale)`` from the host copy of a microscaling launch's parameters:
    uint8 ``[rows, n / g]``, and NVFP4's float32 global scale (None for MX)."""
    sbytes = params[MICRO_HEAD:MICRO_HEAD + p.slots].reshape(p.rows, p.n // p.g)
    gs = None if p.micro[1] == 0 else params[_MICRO_GS:MICRO_HEAD].view(np.float32)[0]
    return sbytes, gs


def plan_blocks(shape, dtype: str, code, symmetric, eps, scale_dtype: str, block) -> Plan:
    """The launch of fine-grained fp8: a C-order ``[rows, n]`` weight in fp8 ``code`` with one
    scale a ``block`` = ``(rows, columns)`` block (ragged at the edges; a size <= 0 or over the
    weight's takes the whole dimension, as the host pass does), the rest as :func:`plan`.

    >>> from gpuq._codetypes import code_type
    >>> p = plan_blocks((300, 200), "bfloat16", code_type("float8_e4m3fn"), 1, 1e-38, "float32", (128, 128))
    >>> p.kind, p.block, p.slots, p.blocks, p.out_shape
    (1, (128, 128), 6, 6, (300, 200))
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} for the weight pass, got {dtype!r}")
    if code.codec != "float8":
        raise ValueError(f"code must be fp8 for block scales in the weight pass, got {code.name!r}")
    rows, n = (int(d) for d in shape)
    br, bc = (min(int(b), d) if b > 0 else d for b, d in zip(block, (rows, n)))
    pieces = -(-rows // max(br, 1)) * -(-n // max(bc, 1))
    return Plan(dtype, rows, n, n, 1 + FP8_FMT["float8_" + code.fp8], 8, int(code.qmin), int(code.qmax),
                int(symmetric), float(eps), SCALE_FMT[scale_dtype], False, False,
                max(1, min(pieces, MAX_BLOCKS)), False, (br, bc))


def enqueue(x, p: Plan, out, scales, zps, sums, counts, flag, keys) -> None:
    """Launch ``p`` on CuPy's current stream: device ``x`` (the stored bits, C order), ``out``
    (:attr:`Plan.out_shape` bytes or more), ``scales`` (float32, :attr:`Plan.slots`), ``zps``
    (int32, or None: symmetric; both read, not written, under :attr:`Plan.given`), ``sums``
    (float64, 3 a block), ``counts`` (int64, 3 a block), ``flag`` (int32, one, zeroed here),
    ``keys`` (uint32, two: the per-tensor range). Nothing is synchronised."""
    from .compiler import get_function

    import cupy

    stream = cupy.cuda.get_current_stream()
    group = weight_pass_group(p.dtype)
    flag[...] = 0
    if p.kind == MICRO:
        _enqueue_micro(x, p, out, scales, sums, counts, keys, group, stream)
        return
    if p.block is not None:
        fn = get_function(SOURCE, group, weight_blocks_name(p.dtype, p.kind))
        fn((p.blocks,), (THREADS,),
           (x, np.int64(p.rows), np.int64(p.n), np.int64(p.block[0]), np.int64(p.block[1]), np.int32(p.qmin),
            np.int32(p.qmax), np.int32(p.symmetric), np.float32(p.eps), np.int32(p.fmt), out, scales, sums,
            counts, flag), stream=stream)
        return
    if p.tensor and not p.given:
        keys[0:1] = KEY_POS_INF
        keys[1:2] = KEY_NEG_INF
        fn = get_function(SOURCE, group, weight_range_name(p.dtype))
        blocks = max(1, min(-(-(p.rows * p.n) // THREADS), MAX_BLOCKS))
        fn((blocks,), (THREADS,), (x, np.int64(p.rows * p.n), keys[0:1], keys[1:2]), stream=stream)
    fn = get_function(SOURCE, group, weight_pass_name(p.dtype, p.kind, p.warp, p.tensor))
    fn((p.blocks,), (THREADS,),
       (x, np.int64(p.rows), np.int64(p.n), np.int64(p.g), np.int32(p.cbits), np.int32(p.qmin),
        np.int32(p.qmax), np.int32(p.symmetric), np.float32(p.eps), np.int32(p.fmt), np.int32(p.given),
        keys[0:1], keys[1:2],
        out, scales, _NULL if zps is None else zps, sums, counts, flag), stream=stream)


def _enqueue_micro(x, p, out, params, sums, counts, keys, group, stream) -> None:
    """The microscaling launches: the range (NVFP4's own global scale), then weight_micro;
    ``params`` the parameters' buffer (:data:`MICRO_HEAD` uploaded, then the scale bytes)."""
    from .compiler import get_function

    if p.tensor:
        keys[0:1] = KEY_POS_INF
        keys[1:2] = KEY_NEG_INF
        fn = get_function(SOURCE, group, weight_range_name(p.dtype))
        blocks = max(1, min(-(-(p.rows * p.n) // THREADS), MAX_BLOCKS))
        fn((blocks,), (THREADS,), (x, np.int64(p.rows * p.n), keys[0:1], keys[1:2]), stream=stream)
    mfmt, mode, _ = p.micro
    fn = get_function(SOURCE, group, weight_micro_name(p.dtype))
    fn((p.blocks,), (THREADS,),
       (x, np.int64(p.rows * p.n), np.int32(p.g), np.int32(mfmt), np.int32(mode), np.float32(p.qmax),
        np.int32(p.fmt), keys[0:1], keys[1:2], params[0:256], params[256:1280].view(np.uint32),
        params[1280:2304].view(np.float32), out, params[MICRO_HEAD:], params[_MICRO_GS:MICRO_HEAD].view(np.float32),
        sums, counts), stream=stream)


def figures(sums: np.ndarray, counts: np.ndarray, blocks: int) -> tuple:
    """``((signal, error, max_abs_error), counts)`` from the host copies of a launch's partials
    (``blocks`` of them), added in block order.

    >>> figures(np.array([1.0, 2.0, 0.5, 3.0, 4.0, 0.25]), np.array([0, 1, 0, 2, 0, 0]), 2)
    ((4.0, 6.0, 0.5), {'nan': 2, 'posinf': 1, 'neginf': 0})
    """
    s = sums[:3 * blocks].reshape(blocks, 3)
    c = counts[:3 * blocks].reshape(blocks, 3)
    signal = error = 0.0
    for k in range(blocks):  # block order, one addition each: the same bits on every run
        signal += float(s[k, 0])
        error += float(s[k, 1])
    return ((signal, error, float(s[:, 2].max())),
            dict(zip(("nan", "posinf", "neginf"), (int(v) for v in c.sum(axis=0)))))
