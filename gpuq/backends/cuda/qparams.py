"""Quantization parameters from data on the GPU: launches of ``kernels/qparams.cu``.

A scheme becomes one of two reductions over C-contiguous ``x`` (a view is
copied to a contiguous temporary first):

============================  =================================================
scheme                        reduction (one launch, partial results by atomics)
============================  =================================================
per-tensor                    ``minmax_segments``: chunks of ``CHUNK``, one slot
per-channel, last axis        ``minmax_columns``: ``[1, rows, C]``
per-channel, other axes       ``minmax_segments``: rows of ``inner``, slot ``r % C``
per-group, last axis          ``minmax_segments``: groups of each row
per-group, other axes         ``minmax_columns``: ``[outer, n, inner]``
multi-axis                    adjacent axes merge into one channel axis; others
                              are moved to the front (a transposed copy)
============================  =================================================

then ``finalize`` (the formula, one thread per slot); blocks ``(br, bc)`` on 2-D merged dims
(128x128 tiles) take ``qparams_tiles`` instead: one thread block per tile reduces it and
writes its parameters, one launch. ``quantize_dynamic``
fuses all of it with the quantization where every block is one contiguous
run (per-token rows, groups along the last axis, small per-tensor): one team
per block reads it, computes its parameters and writes its codes. Where the
rows are aligned whole 16-element units of float16/bfloat16/float32 and a
block holds at most 16384 elements (:func:`unit_schedule`), the team keeps its
block in registers (``dynamic_quantize_units``: x read once, 16-byte loads and
stores); a longer block of those dtypes, of any length and alignment, that fits
the device's shared memory (:func:`staged_bytes`) is staged there
(``dynamic_quantize_staged``: x read once); elsewhere the team reads the block
twice (``dynamic_quantize_segments``).
The failure flag is one word per (device, stream, host thread)
(:func:`failure_flag`); ``check=False`` passes none and reads nothing back.

Importing this module does not import CuPy; the kernel names come from
:mod:`gpuq.backends.cuda.registry`, and the module is compiled on first use.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from ..._scheme import strided_dims
from .registry import (FINALIZE, UNIT_FLOATS, UNIT_SCHEDULES, blocks_name, columns_name, fused_name,
                       qparams_names, segments_name, staged_name, tiles_name, units_name)

SOURCE = "qparams.cu"
#: Elements per piece of a per-tensor (or long-row) reduction: one thread block each.
CHUNK = 1 << 14
#: Longest block a warp reduces; longer ones get a whole thread block.
WARP_MAX = 1024
#: Largest per-tensor tensor quantized by the fused kernel (one thread block).
FUSED_TENSOR_MAX = 1 << 16
THREADS = 256
#: Threads of the staged dynamic kernel (kStagedThreads in kernels/qparams.cu).
STAGED_THREADS = 512
#: The longest block the register kernel holds; longer ones are staged in shared memory.
REGISTER_MAX = max(lanes * units * 16 for lanes, units in UNIT_SCHEDULES)
#: Dynamic shared memory any kernel may take without raising its MaxDynamicSharedMemorySize.
DEFAULT_DYNAMIC_SHARED = 48 << 10
#: Kept below the device's opt-in maximum per block for the kernel's static shared memory
#: (team_minmax's 256 bytes): the opt-in maximum bounds static and dynamic together.
STATIC_SHARED_RESERVE = 1024
_MAX_BLOCKS = 1 << 16
#: Most merged dims a block walk takes (kMaxBlockDims in kernels/qparams.cu, the MSE search's too).
MAX_BLOCK_DIMS = 16
#: Order-preserving keys of +inf and -inf (kernels/qparams.cu, key_of): the identities.
KEY_POS_INF = 0xFF800000
KEY_NEG_INF = 0x007FFFFF
#: The key of the quiet NaN 0x7FC00000: what an empty slot reads back as.
KEY_NAN = np.uint32(0xFFC00000)
_NULL = np.uint64(0)


@functools.cache
def _names() -> tuple:
    return tuple(qparams_names())


def _function(name):
    # Compiled on first use, cached per device (gpuq.backends.cuda.compiler).
    from .compiler import get_function

    return get_function(SOURCE, _names(), name)


def _launch(name, blocks, args):
    # CuPy launches on the current stream.
    _function(name)((int(blocks),), (THREADS,), args)


# --- reductions --------------------------------------------------------------------------------

def _layout(x, scheme):
    """``x`` (contiguous, maybe transposed) and ``(kind, outer, n, inner, g)`` of its reduction."""
    import cupy

    x = cupy.ascontiguousarray(x)
    shape, kind = x.shape, scheme.kind
    if kind == "tensor":
        return x, ("tensor", 1, x.size, 1, None)
    if kind == "axes":
        axes = scheme.axes
        if axes != tuple(range(axes[0], axes[-1] + 1)):
            # Non-adjacent axes: the slots' axes first, in order; a copy.
            rest = tuple(i for i in range(len(shape)) if i not in axes)
            x = cupy.ascontiguousarray(x.transpose(axes + rest))
            axes = tuple(range(len(axes)))
            shape = x.shape
        a0, a1 = axes[0], axes[-1]
        return x, ("channel", math.prod(shape[:a0]), math.prod(shape[a0:a1 + 1]),
                   math.prod(shape[a1 + 1:]), None)
    (k,) = scheme.axes
    outer, n, inner = math.prod(shape[:k]), shape[k], math.prod(shape[k + 1:])
    return x, (kind, outer, n, inner, scheme.group_size)


def minmax_keys(x, scheme):
    """Per-slot (lo, hi) of ``x`` as order-preserving uint32 keys, flat, on the device."""
    import cupy

    nslots = math.prod(scheme.param_shape)
    lo = cupy.full(nslots, KEY_POS_INF, cupy.uint32)
    hi = cupy.full(nslots, KEY_NEG_INF, cupy.uint32)
    if x.size == 0:
        return lo, hi
    if scheme.kind == "block":
        _block_reduction(cupy.ascontiguousarray(x), scheme, lo, hi)
        return lo, hi
    x, (kind, outer, n, inner, g) = _layout(x, scheme)
    if kind == "tensor":
        _segments(x, 1, n, CHUNK, 1, 0, lo, hi)
    elif kind == "channel" and inner == 1:
        _columns(x, 1, outer, n, outer, lo, hi)
    elif kind == "channel":
        _segments(x, outer * n, inner, min(inner, CHUNK), n, 0, lo, hi)
    elif inner == 1:  # group along the last (merged) axis
        _segments(x, outer, n, g, outer, 1, lo, hi)
    else:
        _columns(x, outer, n, inner, g, lo, hi)
    return lo, hi


def minmax(x, scheme):
    """Per-slot ``(lo, hi)`` of ``x`` as float32 arrays of ``scheme.param_shape`` (float64 data:
    its min and max rounded to float32 once, as the parameters use them), NaN where a slot holds
    no number: the order keys of :func:`minmax_keys` turned back into floats."""
    with x.device:
        lo, hi = minmax_keys(x, scheme)
        empty = (lo > hi).astype(np.uint32)  # the identities (+inf, -inf) never met a number
        out = []
        for k in (lo, hi):
            k = k + empty * (KEY_NAN - k)  # uint32, modulo 2**32: an empty slot takes a NaN's key
            # A key back to the float's bits: a positive key's sign bit cleared, a negative one's all flipped.
            bits = k ^ (((k >> 31) - np.uint32(1)) | np.uint32(0x80000000))
            out.append(bits.view(np.float32).reshape(scheme.param_shape))
    return tuple(out)


def _block_reduction(x, scheme, lo, hi):
    """Blocks of any shape, by the scheme's index map: the reductions of the schemes they
    coincide with (per-tensor, per-channel, groups), else one thread block per block."""
    name, m0, m1, m2, dims = scheme.index_map
    total = x.size
    if name == "tensor":
        _segments(x, 1, total, CHUNK, 1, 0, lo, hi)
    elif name == "channel" and m1 == 1:
        _columns(x, 1, total // m0, m0, total // m0, lo, hi)
    elif name == "channel":
        _segments(x, total // m1, m1, min(m1, CHUNK), m0, 0, lo, hi)
    elif name == "group" and m1 == 1:
        _segments(x, total // m0, m0, m2, total // m0, 1, lo, hi)
    elif name == "group":
        _columns(x, total // (m0 * m1), m0, m1, m2, lo, hi)
    else:  # "strided" or "expand" (more alternating dims than the element maps take): the block walk
        from .launch import device_id, dims_array

        nd, dims = block_dims(scheme, "a block reduction")
        _launch(blocks_name(x.dtype), min(lo.size, _MAX_BLOCKS),
                (x, np.int32(nd), dims_array(device_id(x), dims), np.int64(lo.size), lo, hi))


def block_dims(scheme, what: str) -> tuple:
    """The blocks of ``scheme`` as ``minmax_blocks`` and ``mse_search`` walk them: ``(nd, dims)``,
    ``dims`` the merged dims' sizes, then their parameter strides (0 where a block covers its
    dim), then their block sizes (the strided map's layout, ``Scheme.index_map``), over
    ``Scheme.merged``; a ``ValueError`` (naming ``what``) past :data:`MAX_BLOCK_DIMS`.

    >>> from gpuq._scheme import Scheme
    >>> block_dims(Scheme.build((4, 256), axis=1, group_size=128), "x")
    (2, (4, 256, 2, 1, 1, 128))
    >>> block_dims(Scheme.build((3, 5, 7), axis=1), "x")
    (3, (3, 5, 7, 0, 1, 0, 3, 1, 7))
    >>> block_dims(Scheme.build(()), "x")
    (1, (1, 0, 1))
    """
    merged = scheme.merged or ((1, 1, "whole"),)  # one element (0-d, all dims 1): one block of it
    if len(merged) > MAX_BLOCK_DIMS:
        raise ValueError(f"{what} on a device array takes at most {MAX_BLOCK_DIMS} alternating dims "
                         f"of blocks, got {len(merged)} for {scheme.describe()}; reshape or "
                         f"transpose x so that fewer alternate")
    return len(merged), strided_dims(merged)


def _segments(x, rows, n, g, pmod, jstride, lo, hi):
    pieces = rows * -(-n // g)
    warp = min(g, n) <= WARP_MAX
    blocks = -(-pieces // (THREADS // 32)) if warp else pieces
    _launch(segments_name(x.dtype, warp), min(blocks, _MAX_BLOCKS),
            (x, np.int64(rows), np.int64(n), np.int64(g), np.int64(pmod), np.int32(jstride), lo, hi))


def _columns(x, outer, n, inner, g, lo, hi):
    slots = outer * -(-n // g) * inner
    tall = min(g, n)
    # Enough threads to fill the device: split each group's rows over blockIdx.y.
    ysplit = max(1, min(65535, tall, (1 << 18) // max(slots, 1)))
    rows_per_y = -(-tall // ysplit)
    ysplit = -(-tall // rows_per_y)
    fn = _function(columns_name(x.dtype))
    fn((-(-slots // THREADS), ysplit), (THREADS,),
       (x, np.int64(outer), np.int64(n), np.int64(inner), np.int64(g), np.int64(rows_per_y), lo, hi))


# --- parameters ----------------------------------------------------------------------------------

def _outputs(scheme, qmin, symmetric, check=True):
    """Scales, zps (None for symmetric signed codes) and the failure flag (None unchecked)."""
    import cupy

    scales = cupy.empty(scheme.param_shape, cupy.float32)
    zps = None if (symmetric and qmin < 0) else cupy.empty(scheme.param_shape, cupy.int32)
    return scales, zps, (failure_flag() if check else None)


class _Flags(threading.local):
    """This thread's failure flags, one 4-byte word per (device, stream) handle."""

    def __init__(self):
        self.by_stream = {}


_flags = _Flags()


def failure_flag():
    """The failure flag of the current device and stream, cleared on that stream (one
    ``cudaMemsetAsync``: no allocation and no fill kernel per call).

    A flag is never shared by two streams (a clear on one could land between a kernel and the
    read-back on the other) nor by two host threads (two threads may issue to one stream, the
    legacy default stream for one, and interleave their clears, kernels and read-backs): each
    host thread keeps one word per (device, stream) it used. Every checked call reads its flag
    back before it returns, so one thread's calls on one stream never overlap on it.
    """
    import cupy

    stream = cupy.cuda.get_current_stream()
    key = (cupy.cuda.runtime.getDevice(), int(stream.ptr))
    flag = _flags.by_stream.get(key)
    if flag is None:
        flag = _flags.by_stream[key] = cupy.empty(1, cupy.int32)
    cupy.cuda.runtime.memsetAsync(flag.data.ptr, 0, 4, stream.ptr)
    return flag


#: The kernels' number of each scale dtype (kernels/qparams.cu ``round_scale``).
SCALE_FMT = {"float32": 0, "bfloat16": 1, "float16": 2}


def raise_on_failure(flag, scale_dtype):
    # One 4-byte read-back: the only synchronisation of these calls.
    bits = int(flag.get()[0])
    if bits & 1:
        raise ValueError(
            "x must be finite (and within float32) to choose quantization parameters, got +/-inf"
        )
    if bits & 2:
        raise ValueError(f"scale_dtype {scale_dtype} cannot hold every scale chosen for x: one rounds "
                         f"to 0 or overflows {scale_dtype}; pass a larger eps or use a wider scale_dtype")


def choose_qparams(x, scheme, qmin, qmax, symmetric, eps, scale_dtype="float32", check=True):
    """Scales and zero points for device ``x`` (validated by ``gpuq.qparams``).

    Everything is allocated and launched on ``x``'s device, whichever is current. ``check``:
    read the failure flag back (a synchronisation) and raise; unchecked, a block holding +/-Inf
    gets scale +Inf (zero point 0 where it has one) and nothing is read back.
    """
    with x.device:
        tiles = _tiles(scheme) if x.size else None
        if tiles is not None:  # 2-D blocks: one launch, each tile writes its own parameters
            import cupy

            x = cupy.ascontiguousarray(x)
            scales, zps, flag = _outputs(scheme, qmin, symmetric, check)
            _launch(tiles_name(x.dtype), min(scales.size, _MAX_BLOCKS),
                    (x, *map(np.int64, tiles), np.int64(scales.size), np.int32(qmin), np.int32(qmax),
                     np.int32(symmetric), np.float32(eps), np.int32(SCALE_FMT[scale_dtype]), scales,
                     _NULL if zps is None else zps, _NULL if flag is None else flag))
            if check:
                raise_on_failure(flag, scale_dtype)
            return scales, zps
        lo, hi = minmax_keys(x, scheme)
        scales, zps, flag = _outputs(scheme, qmin, symmetric, check)
        if lo.size:
            _launch(FINALIZE, min(-(-lo.size // THREADS), _MAX_BLOCKS),
                    (lo, hi, np.int64(lo.size), np.int32(qmin), np.int32(qmax), np.int32(symmetric),
                     np.float32(eps), np.int32(SCALE_FMT[scale_dtype]), scales,
                     _NULL if zps is None else zps, _NULL if flag is None else flag))
            if check:
                raise_on_failure(flag, scale_dtype)
    return scales, zps


def _tiles(scheme):
    """``(rows, cols, br, bc)`` of blocks on 2-D merged dims (``qparams_tiles``), else None."""
    from .launch import block_tiles

    name, m0, _, _, dims = scheme.index_map
    return block_tiles(name, m0, dims) if scheme.kind == "block" else None


def _fused_rows(shape, scheme):
    """``(rows, n, g)`` when every block is one contiguous run of C-order ``x``, else None
    (blocks of several rows and others: the two-pass path)."""
    if scheme.kind == "block":
        return None
    if scheme.kind == "tensor":
        size = math.prod(shape)
        return (1, size, size) if size <= FUSED_TENSOR_MAX else None
    axes = scheme.axes
    if scheme.kind == "group":
        (k,) = axes
        if math.prod(shape[k + 1:]) == 1:
            return math.prod(shape[:k]), shape[k], scheme.group_size
        return None
    # channel / adjacent multi-axis with nothing before the axes: one row per slot.
    if axes != tuple(range(axes[0], axes[-1] + 1)) or math.prod(shape[:axes[0]]) != 1:
        return None
    rows, n = math.prod(shape[axes[0]:axes[-1] + 1]), math.prod(shape[axes[-1] + 1:])
    return rows, n, n


def unit_schedule(x, n, g):
    """``(lanes, units)`` of the read-once kernel (``dynamic_quantize_units``) for contiguous
    device ``x`` cut in rows of ``n`` and blocks of ``g``, or None where it does not apply (then
    ``dynamic_quantize_segments``): float16/bfloat16/float32 data 16-byte aligned, rows of
    whole 16-element units, blocks starting on one (``g`` a multiple of 16, or the whole row),
    a block of at most 16384 elements; the fewest lanes whose registers hold the block.

    >>> import numpy as np
    >>> from types import SimpleNamespace as NS
    >>> x = NS(dtype=np.dtype(np.float32), data=NS(ptr=4096))
    >>> unit_schedule(x, 16384, 16384), unit_schedule(x, 4096, 128), unit_schedule(x, 4104, 4104)
    ((256, 4), (8, 1), None)
    """
    from ..._dtypes import dtype_name

    if dtype_name(x.dtype) not in UNIT_FLOATS or x.data.ptr % 16 or n % 16 or (g < n and g % 16):
        return None
    size = min(g, n)
    return next(((lanes, units) for lanes, units in UNIT_SCHEDULES if size <= lanes * units * 16), None)


def staged_bytes(size: int, itemsize: int) -> int:
    """Dynamic shared memory of ``dynamic_quantize_staged`` for blocks of at most ``size``
    elements of ``itemsize`` bytes: the block, its alignment shift (up to one 16-byte vector)
    and the chunk on either side that the quads read (kernels/qparams.cu).

    >>> staged_bytes(16400, 4), staged_bytes(65536, 2)
    (65728, 131136)
    """
    return (size + 32) * itemsize


def staged_limit(device_id: int) -> int:
    """The most dynamic shared memory the staged kernel takes on device ``device_id``: the
    device's opt-in maximum per block (``sharedMemPerBlockOptin``: 227 KB on sm_90, 163 KB on
    sm_80, 99 KB on sm_86/89) less :data:`STATIC_SHARED_RESERVE`."""
    import cupy

    return _staged_limit(device_id, cupy.cuda.Device(device_id).compute_capability)


@functools.cache
def _staged_limit(device_id, cc):  # (cc: the CPU execution switches it in-process)
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["sharedMemPerBlockOptin"]) - STATIC_SHARED_RESERVE


def staged_schedule(x, n, g):
    """The dynamic shared memory in bytes of the staged read-once kernel for contiguous device
    ``x`` cut in rows of ``n`` and blocks of ``g``, or None where it does not apply:
    float16/bfloat16/float32 blocks longer than the registers hold (:data:`REGISTER_MAX`) that
    fit the device's shared memory (:func:`staged_limit`). Any length and alignment."""
    from ..._dtypes import dtype_name

    size = min(g, n)
    if dtype_name(x.dtype) not in UNIT_FLOATS or size <= REGISTER_MAX:
        return None
    need = staged_bytes(size, x.dtype.itemsize)
    return need if need <= staged_limit(x.device.id) else None


def _staged_function(name, device_id):
    """The staged kernel ``name`` with its MaxDynamicSharedMemorySize raised, once per device,
    to :func:`staged_limit` (above 48 KB a launch needs it: cudaFuncSetAttribute)."""
    fn = _function(name)
    limit = staged_limit(device_id)
    if (fn, limit) not in _raised:
        if limit > DEFAULT_DYNAMIC_SHARED:
            fn.max_dynamic_shared_size_bytes = limit
        _raised.add((fn, limit))
    return fn


_raised = set()  # (loaded staged kernel, the limit it was raised to)


def quantize_dynamic(x, scheme, qdtype, symmetric, eps, scale_dtype="float32", check=True):
    """Codes, scales and zps in one launch where :func:`_fused_rows` allows, else None;
    ``check`` as in :func:`choose_qparams`."""
    import cupy

    fused = _fused_rows(x.shape, scheme) if x.size else None
    if fused is None:
        return None
    rows, n, g = fused
    # One team per block: blocks longer than a team can keep on chip, or too few
    # blocks to fill the GPU, go to the two-pass path (full-grid reduction + quantize).
    if min(g, n) > FUSED_TENSOR_MAX:
        return None
    qmin = np.iinfo(qdtype).min
    with x.device:
        # The codes take x's shape: CuPy's ascontiguousarray makes a 0-d array 1-d.
        q = cupy.empty(x.shape, qdtype)
        x = cupy.ascontiguousarray(x)
        scales, zps, flag = _outputs(scheme, qmin, symmetric, check)
        pieces = rows * -(-n // g)
        args = (x, q, np.int64(rows), np.int64(n), np.int64(g), np.int32(symmetric), np.float32(eps),
                np.int32(SCALE_FMT[scale_dtype]), scales, _NULL if zps is None else zps,
                _NULL if flag is None else flag)
        schedule = unit_schedule(x, n, g)
        staged = None if schedule is not None else staged_schedule(x, n, g)
        if staged is not None:  # each block read once, staged in shared memory
            fn = _staged_function(staged_name(x.dtype, qdtype), x.device.id)
            fn((min(pieces, _MAX_BLOCKS),), (STAGED_THREADS,), args, shared_mem=staged)
        else:
            if schedule is not None:  # each block read once, from registers
                name, blocks = units_name(x.dtype, qdtype, *schedule), -(-pieces // max(1, THREADS // schedule[0]))
            else:
                warp = min(g, n) <= WARP_MAX
                name = fused_name(x.dtype, qdtype, warp)
                blocks = -(-pieces // (THREADS // 32)) if warp else pieces
            _launch(name, min(blocks, _MAX_BLOCKS), args)
        if check:
            raise_on_failure(flag, scale_dtype)
    return q, scales, zps
