"""Launching gpuq's CUDA kernels on CuPy arrays: arrays, parameters, index maps, alignment, grids.

Imported by the dispatcher only for device arrays; CuPy is imported inside
the functions, so importing this module never touches CUDA.

* Arrays: a ``cupy.ndarray`` is used as is; objects exposing
  ``__cuda_array_interface__`` (Numba, PyTorch) or a CUDA ``__dlpack__``
  (PyTorch, JAX) are wrapped zero-copy. Results are CuPy arrays on the
  device of ``src`` (not device 0), computed on CuPy's current stream.
* One kernel launch per call for every scheme (see :attr:`gpuq._scheme.Scheme.index_map`), no host
  synchronisation on the call path, except the opt-out value check of
  device-resident scales/zps (one reduction and one synchronisation).
  Host parameters are uploaded on each call, except a single host scale and
  zero point (per-tensor, or any scheme with one parameter), which reach the
  kernel by value: such a call is one launch and no copy.
* Non-contiguous ``src`` is copied once with ``cupy.ascontiguousarray`` (one
  extra read and write of src); a non-contiguous ``out`` is written through
  a contiguous temporary and one copy into ``out``. Contiguous views at any
  offset need no copy: units of 16 elements start at the float side's first
  16-byte aligned element (a scalar head before it, a scalar tail); the float
  side then uses 16-byte vectors, the code side too where it is aligned at
  that element, else single bytes (a view like ``x[1:]`` pays for that).
* Compiled on first use per dtype pair, once per device architecture
  (:mod:`gpuq.backends.cuda.compiler`).

>>> import cupy, gpuq                                   # doctest: +SKIP
>>> x = cupy.asarray([0.5, 1.5, -300.0], cupy.float32)  # doctest: +SKIP
>>> gpuq.quantize(x, 1.0)                               # doctest: +SKIP
array([   0,    2, -128], dtype=int8)
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ..._dtypes import INT32_MAX, INT32_MIN
from . import registry
from .compiler import get_function, load_module, prepare_nvrtc  # noqa: F401  (load_module: re-export)

#: Threads per block (the kernels' __launch_bounds__).
THREADS = 256


def cupy_module():
    import cupy

    return cupy


def as_cupy(obj):
    """``obj`` as a ``cupy.ndarray`` without copying.

    >>> import torch                                    # doctest: +SKIP
    >>> as_cupy(torch.ones(3, device="cuda")).shape     # doctest: +SKIP
    (3,)
    """
    cupy = cupy_module()
    prepare_nvrtc()  # CuPy's own kernels (value checks, copies) compile through NVRTC too
    if isinstance(obj, cupy.ndarray):
        return obj
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        # DLPack first (JAX has both): its handshake orders the producer's work before the
        # consumer's stream on the device, where CAI v3 makes the host wait. Under the
        # producer's device: the consumer's stream is the current stream of the current device.
        with cupy.cuda.Device(int(obj.__dlpack_device__()[1])):
            return cupy.from_dlpack(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return cupy.asarray(obj)
    raise TypeError(
        f"expected a CUDA array (CuPy, __cuda_array_interface__ or a CUDA __dlpack__), "
        f"got {type(obj).__module__}.{type(obj).__qualname__}"
    )


def device_id(arr) -> int:
    return arr.device.id


def grid(units: int) -> int:
    """Blocks for ``units`` 16-element units: one unit per thread.

    A grid of one wave of resident blocks (8 per SM at 256 threads) with a
    grid-stride loop would be wrong here: the kernels' registers let 3 to 6
    blocks stay resident per SM (bench/NOTES.md, the compiler's report), and
    the blocks beyond those would each run a whole share afterwards, a second
    thin wave. Many short blocks balance themselves.
    """
    return max(1, min(-(-units // THREADS), 2**31 - 1))  # the grid-stride loop covers any excess


@functools.cache
def dims_array(device_id: int, dims: tuple):
    """The strided map's dims on the device: uploaded at the first call of a scheme on a
    device, which waits for the upload once; later calls, from any stream, read a finished
    array and neither wait nor synchronise (so they can be captured in a CUDA graph: a wait
    on an event recorded outside a capture would break it). Never evicted: a kernel still
    queued on another stream may be reading it, and a pool block is reused at once."""
    cupy = cupy_module()
    with cupy.cuda.Device(device_id):
        arr = cupy.asarray(np.asarray(dims, dtype=np.int64))
        cupy.cuda.get_current_stream().synchronize()
    return arr


def alignment(float_arr, code_arr, n: int):
    """``(head, vec)`` for the kernels: the first element from which the float
    side is 16-byte aligned, and which sides may use 16-byte vectors there."""
    fa, isz = float_arr.data.ptr, float_arr.itemsize
    if fa % isz:
        return 0, 0  # not even element-aligned: scalar units only
    head = min(((-fa) % 16) // isz, n)
    vec = 1  # kVecFloat
    if (code_arr.data.ptr + head) % 16 == 0:
        vec |= 2  # kVecCode
    return head, vec


@functools.cache
def _names(op: str, a, b):
    group = (registry.quantize_group if op == "quantize" else registry.dequantize_group)(a, b)
    maker = registry.quantize_name if op == "quantize" else registry.dequantize_name
    return group, {(z, m): maker(a, b, z, m) for z in (False, True) for m in registry.MAPS}


_BITS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


def _by_value(scales, zps):
    """``(m0, m1)`` of the value map when the parameters are one host value each
    (the scale's bits, the zero point), else None (read from device memory).

    >>> _by_value(np.array([0.5], np.float32), np.array(3, np.int32))
    (1056964608, 3)
    >>> _by_value(np.array([0.5, 0.25], np.float32), None) is None
    True
    """
    if not (isinstance(scales, np.ndarray) and scales.size == 1 and scales.dtype in _BITS):
        return None
    if zps is not None and not (isinstance(zps, np.ndarray) and zps.size == 1):
        return None
    return scales.view(_BITS[scales.dtype]).item(), 0 if zps is None else zps.item()


def per_element(params, scheme):
    """Device ``params`` of ``scheme`` (its parameter grid, any layout of the same size)
    repeated to the tensor's shape: element ``i`` holds its block's parameter, C-contiguous.
    Multi-axis schemes are blocks of 1 on their axes, whole elsewhere."""
    cupy = cupy_module()
    grid = tuple(-(-n // b) for n, b in zip(scheme.shape, scheme.blocks))
    p = params.reshape(grid)
    for d, (n, b, g) in enumerate(zip(scheme.shape, scheme.blocks, grid)):
        if g > 1 and b > 1:  # each entry b times along d, then the ragged end cut off
            s = p.shape
            wide = cupy.broadcast_to(p.reshape(s[:d + 1] + (1,) + s[d + 1:]), s[:d + 1] + (b,) + s[d + 1:])
            p = cupy.ascontiguousarray(wide).reshape(s[:d] + (g * b,) + s[d + 1:])[(slice(None),) * d + (slice(0, n),)]
    return cupy.ascontiguousarray(cupy.broadcast_to(p, scheme.shape))


#: Below this many elements every index and divisor of a map fits the kernels' FastDivmod.
FAST_DIVISION_LIMIT = 2**31


def fast_divisor(d: int) -> int:
    """Divisor ``d`` (``1 <= d < 2**31``) with its magic multiplier, packed as the kernels'
    FastDivmod reads a map argument (kernels/elementwise.cuh): a negative int64 with ``mult``
    in bits 62..31 and ``d`` in bits 30..0, where ``a // d == (mulhi(a, mult) + a) >> shift``
    for every ``0 <= a < 2**31`` (``shift = ceil(log2 d)``, ``mult = 2**32 (2**shift - d) // d
    + 1``; Granlund and Montgomery, PLDI 1994, as PyTorch's IntegerDivider).

    >>> m = fast_divisor(7); (m < 0, m & 0x7fffffff, (m >> 31) & 0xffffffff)
    (True, 7, 613566757)
    >>> fast_divisor(1) & 0x7fffffff, (fast_divisor(1) >> 31) & 0xffffffff
    (1, 1)
    """
    if not 1 <= d < FAST_DIVISION_LIMIT:
        raise ValueError(f"fast_divisor: d must be in [1, 2**31), got {d}")
    shift = (d - 1).bit_length()
    mult = (2**32 * (2**shift - d)) // d + 1
    return ((1 << 63) | (mult << 31) | d) - (1 << 64)


def device_map_params(map_name: str, m0: int, m1: int, m2: int, n: int, dims=None) -> tuple:
    """The ``(m0, m1, m2)`` a launch over ``n`` elements passes (kernels/elementwise.cuh): below
    ``2**31`` elements the divisors packed by :func:`fast_divisor` -- the channel map's ``C,
    inner``, the group map's ``n, inner, g`` (a group longer than its axis is one group: ``g``
    becomes the axis length, the same walk) and, for blocks ``(br, bc)`` on 2-D merged dims
    ``(R, C)``, the 2-D block map's ``br, C, bc`` -- else as they are (the kernels then divide
    in 32 or 64 bits, or walk ``dims``).

    >>> device_map_params("channel", 3, 4, 0, 12) == (fast_divisor(3), fast_divisor(4), 0)
    True
    >>> device_map_params("channel", 3, 2**31, 0, 3 * 2**31)
    (3, 2147483648, 0)
    >>> dims = (300, 200, 2, 1, 128, 128)
    >>> device_map_params("strided", 2, 0, 0, 60000, dims) == tuple(map(fast_divisor, (128, 200, 128)))
    True
    """
    if n >= FAST_DIVISION_LIMIT or (map_name in ("channel", "group") and min(m0, m1) < 1):
        return m0, m1, m2  # (an empty tensor launches nothing that reads them)
    if map_name == "channel":
        return fast_divisor(m0), fast_divisor(m1), m2
    if map_name == "group":
        return fast_divisor(m0), fast_divisor(m1), fast_divisor(min(m2, m0))
    tiles = block_tiles(map_name, m0, dims)
    if tiles is not None:
        _, cols, br, bc = tiles
        return fast_divisor(br), fast_divisor(cols), fast_divisor(bc)
    return m0, m1, m2


def block_tiles(map_name: str, m0: int, dims) -> tuple | None:
    """``(rows, cols, br, bc)`` when an index map is blocks ``(br, bc)`` on 2-D merged dims whose
    parameter is ``(row // br) * ceil(cols / bc) + col // bc`` (the param grid in C order; a
    stride 0 where a block covers its dim, whose quotient is 0 there), else None. The 2-D block
    map and ``choose_qparams``' one-block-per-tile kernel take these.

    >>> block_tiles("strided", 2, (300, 200, 2, 1, 128, 128))
    (300, 200, 128, 128)
    >>> block_tiles("strided", 3, (2, 3, 4, 4, 0, 1, 1, 3, 1)) is None
    True
    """
    if map_name != "strided" or m0 != 2:
        return None
    rows, cols, ps0, ps1, br, bc = dims
    if ps0 in (-(-cols // bc), 0 if br >= rows else -1) and ps1 in (1, 0 if bc >= cols else -1):
        return rows, cols, br, bc
    return None


def map_args(src, scheme, scales, zps):
    """``(map_name, (m0, m1, m2), dims_arg, scales, zps)``: the index map a launch over
    contiguous ``src`` takes, and its parameters as device pointers (or, under the value
    map, any pointer: they are not read)."""
    cupy = cupy_module()
    value = _by_value(scales, zps)
    if value is not None:
        return "value", (*value, 0), src, src, None if zps is None else src
    # A host value paired with a device one (to_param keeps one host value on the host).
    scales, zps = (cupy.asarray(p) if isinstance(p, np.ndarray) else p for p in (scales, zps))
    map_name, m0, m1, m2, dims = scheme.index_map
    if map_name == "expand":
        # Rare: parameters repeated to one per element (n each), then p = i.
        scales = per_element(scales, scheme)
        zps = None if zps is None else per_element(zps, scheme)
        map_name, m0, m1 = "channel", src.size, 1
    dims_arg = scales if dims is None else dims_array(device_id(src), dims)
    return map_name, device_map_params(map_name, m0, m1, m2, src.size, dims), dims_arg, scales, zps


def _launch(op, src, out, scheme, scales, zps):
    """One launch of the ``op`` kernel for contiguous ``src``/``out`` on src's device."""
    cupy = cupy_module()
    n = src.size
    has_zp = zps is not None
    map_name, (m0, m1, m2), dims_arg, scales, zps = map_args(src, scheme, scales, zps)
    if op == "quantize":
        float_arr, code_arr, a, b = src, out, src.dtype, out.dtype
    else:
        float_arr, code_arr, a, b = out, src, src.dtype, out.dtype
    group, names = _names(op, a, b)
    fn = get_function(f"{op}.cu", group, names[(has_zp, map_name)])
    head, vec = alignment(float_arr, code_arr, n)
    units = 1 + -(-(n - head) // 16)
    args = (src, out, scales, scales if not has_zp else zps, np.int64(n), np.int64(head),
            np.int32(vec), np.int64(m0), np.int64(m1), np.int64(m2), dims_arg)
    fn((grid(units),), (THREADS,), args, stream=cupy.cuda.get_current_stream())


def run(op, src, scheme, scales, zps, out):
    cupy = cupy_module()
    with src.device:
        x = src if src.flags.c_contiguous else cupy.ascontiguousarray(src)
        y = out if out.flags.c_contiguous else cupy.empty(out.shape, out.dtype)
        _launch(op, x, y, scheme, scales, zps)
        if y is not out:
            out[...] = y


class StreamReaders:
    """Device arrays uploaded once and read from any stream (an op object's parameters), kept
    out of CuPy's pool until the last stream that read them has passed its reads.

    CuPy's pool gives a freed block to the next allocation on the stream that allocated it, at
    once: a kernel queued on another stream may still be reading it. So every use notes its
    stream (:meth:`note_read`: an event recorded there after the launch, re-recorded by later
    uses), except the uploading stream, whose later allocations are ordered after its queued
    work anyway, and a stream being captured into a CUDA graph, whose replays the graph's owner
    orders. When the owner goes (:meth:`release`), arrays with an unpassed event wait in a list
    that every later upload and release sweeps.

    >>> import cupy                                        # doctest: +SKIP
    >>> r = StreamReaders((cupy.ones(4),)); r.note_read(); r.release()  # doctest: +SKIP
    """

    _waiting = []  # (arrays, events) whose owner is gone, until the events have passed
    _lock = threading.Lock()

    def __init__(self, arrays):
        self.arrays = arrays
        self.upload_stream = cupy_module().cuda.get_current_stream().ptr
        self.events = {}  # stream pointer -> its Event, re-recorded at each use
        self._sweep()

    def note_read(self) -> None:
        cupy = cupy_module()
        stream = cupy.cuda.get_current_stream()
        if stream.ptr == self.upload_stream or getattr(stream, "is_capturing", lambda: False)():
            return
        event = self.events.get(stream.ptr)
        if event is None:
            event = self.events[stream.ptr] = cupy.cuda.Event(disable_timing=True)
        event.record(stream)

    def release(self) -> None:
        pending = [e for e in self.events.values() if not e.done]
        if pending:
            with self._lock:
                self._waiting.append((self.arrays, pending))
        self.arrays, self.events = (), {}
        self._sweep()

    @classmethod
    def _sweep(cls) -> None:
        with cls._lock:
            cls._waiting[:] = [(a, ev) for a, ev in cls._waiting if not all(e.done for e in ev)]
