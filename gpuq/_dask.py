"""Dask arrays through gpuq's API: a lazy graph of the in-memory calls, chunk by chunk.

``gpuq.quantize``, ``dequantize``, ``choose_qparams`` and ``quantize_dynamic``
reach :func:`call` (through ``_interop.callers_type``) when ``src``/``x`` is a
``dask.array.Array`` of NumPy or CuPy chunks. They return Dask arrays of the
same chunk type (``type(result._meta)`` is the input's), computing nothing,
and each computed result has the bits of the in-memory call on the computed
array. ``meta=`` is always given: building a graph never runs a kernel on an
empty stand-in.

Checks. Argument checks (dtypes, names, axis, group_size, shapes of scales and
zps, host parameter values) raise at the call, with gpuq's own messages;
checks that need the data (values of scales held in a Dask array, Inf in
``choose_qparams``) raise when the result is computed. ``out=`` is refused
(``TypeError``): a Dask array is not written in place.

Chunks and parameters. ``map_blocks`` pairs blocks by position, not size, so
parameters are always rechunked to the data, never the reverse:

* per-channel / multi-axis: scales and zps (NumPy, CuPy or Dask arrays) are cut
  or rechunked to ``src``'s chunks along the scheme's axes (a Dask parameter
  with other chunk sizes along the axis is rechunked, never paired by position);
* per-group: a group never straddles a chunk. Where the chunks along the group
  axis are not multiples of ``group_size`` (except the last), ``src`` is
  rechunked along that axis: each chunk boundary moves down to a multiple of
  ``group_size`` (the remainder stays in the last chunk), as ``dask.array.coarsen``
  aligns its chunks. **That costs a rechunk** (data moves between neighbouring
  chunks); chunk along the group axis in multiples of ``group_size`` to avoid it.

Parameters from data. With ``method="mse"`` every block must lie inside one chunk (the
search sums each block's errors in its C order): the dims a block spans are rechunked to one
chunk each where they are not (per-group and block schemes are aligned as above), and each
chunk is one in-memory call. With ``method="minmax"``, ``choose_qparams`` reduces every chunk to the exact
per-slot min and max (the backends' own reductions: the host ``minmax``, the
CUDA order keys), combines them in a tree (``dask.array.reduction``; min and max
are exact in any order) and turns the global (min, max) of each slot into
scales and zero points with gpuq's own formula, so the result equals the
in-memory one bit for bit. Where every block of the scheme lies inside one
chunk (per-group always; per-channel when the other axes are one chunk each),
there is nothing to combine and each chunk is one in-memory call.

``quantize_dynamic``: one pass where each block lies inside one chunk (each
chunk is one fused in-memory call: nothing held). Otherwise the parameters need
all of ``x`` before any code can be written, and gpuq chooses **one pass with
the data held**: the returned graph reads each chunk of ``x`` once, for its
min/max and, once the parameters are known, for its codes; the scheduler holds
the chunks of ``x`` in memory in between. Where ``x`` does not fit in the
workers' memory, take **two passes** instead, holding nothing::

    scales, zps = dask.compute(*gpuq.choose_qparams(x, axis=0))   # pass 1
    q = gpuq.quantize(x, scales, zps, axis=0)                     # pass 2 (lazy)

Both give the same bits. Chunk functions run under the chunk's device and on
CuPy's current stream there (a multi-GPU worker may hold chunks of several
devices). The op objects (``gpuq.Quantize(...)(x)``...) take Dask arrays too:
each is the functional call it stands for (``gpuq.ops``), so the same rules hold.

Threads. Dask runs as many chunk tasks at once as a worker has threads; each
chunk's host call takes its share of gpuq's threads (:func:`_threads_shared`).

May import: dask (inside functions only: ``import gpuq`` never imports it),
gpuq._dispatch, gpuq._params, gpuq._scheme, gpuq._dtypes and
the backends (their min/max reductions).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import mmap
import sys
import threading
import uuid

import numpy as np

from ._codes import Codes
from ._codetypes import as_code_type, code_type
from ._dispatch import backend_for, is_device_array
from ._dtypes import FLOAT_DTYPES, as_dtype, compute_dtype, native
from ._params import check_shape, scales_param, zps_param
from ._qoptions import validate
from ._scheme import Scheme

__all__ = ["call"]

_ELEMENTWISE = ("quantize", "dequantize")
_QPARAMS = ("choose_qparams", "quantize_dynamic")


def call(public, fn, arg, args, kwargs):
    """Run the public function ``public`` (undecorated: ``fn``) lazily over Dask ``args[arg]``.

    >>> import numpy as np, gpuq
    >>> import dask.array as da                                  # doctest: +SKIP
    >>> x = da.from_array(np.linspace(-1, 1, 8, dtype=np.float32), chunks=3)  # doctest: +SKIP
    >>> q = gpuq.quantize(x, 1 / 127)                            # doctest: +SKIP
    >>> q.compute()                                              # doctest: +SKIP
    array([-127,  -91,  -54,  -18,   18,   54,   91,  127], dtype=int8)
    """
    name = fn.__name__
    if fn.__module__ == "gpuq.ops" and name == "__call__":
        # An op object: the functional call it stands for, whose src is this Dask array.
        inspect.signature(fn).bind(*args, **kwargs)  # a bad call: Python's TypeError, naming the op
        if kwargs.get("out") is not None:
            raise TypeError(_NO_OUT)
        _known_shape(args[arg], "src")
        op, *rest = args
        return op._on_dask(*rest, **kwargs)
    if fn.__module__ not in ("gpuq.api", "gpuq.qparams") or name not in _ELEMENTWISE + _QPARAMS:
        raise TypeError(f"{fn.__qualname__} takes NumPy or CUDA arrays, not Dask arrays")
    bound = inspect.signature(fn).bind(*args, **kwargs)  # a bad call: Python's TypeError, now
    bound.apply_defaults()
    a = dict(bound.arguments)
    src = a.pop(list(a)[arg])
    codes = src.dtype if isinstance(src, Codes) else getattr(src, "dtype", None)
    packed = [row for row in (code_type(a.get("dtype")), code_type(codes) if name == "dequantize" else None)
              if row is not None and row.storage == "packed"]  # a name, a dtype or a type: one rule
    if packed:
        raise TypeError(
            f"Dask arrays take int8/uint8 and fp8 codes; {packed[0].name} codes (packed two per "
            f"byte) are not supported on Dask arrays yet: a packed chunk is not an array Dask can "
            f"join; compute the chunks and call gpuq.{name} on each, or use int8/uint8 or fp8"
        )
    if name in _ELEMENTWISE:
        return _elementwise(public, name, src, a)
    return _qparams(public, name, src, a)


_NO_OUT = ("out= cannot be used with a Dask src: a Dask array is not written in place; "
           "use the returned array (dask.array.store writes it to a target)")


# --- chunks ----------------------------------------------------------------------------------------

def _chunk_kind(arr, argname):
    """The chunk type of ``arr``, as its ``_meta`` (a zero-size NumPy or CuPy array): what the
    graph's metadata and the chunks' backend are made from."""
    meta = arr._meta
    ma = sys.modules.get("numpy.ma")
    if ma is not None and isinstance(meta, ma.MaskedArray):
        raise TypeError(f"{argname} must not have masked chunks (numpy.ma): gpuq cannot honour a mask")
    if not (isinstance(meta, np.ndarray) or is_device_array(meta)):
        raise TypeError(f"{argname} must be a Dask array of NumPy or CuPy chunks, got chunks of type "
                        f"{type(meta).__module__}.{type(meta).__qualname__}")
    return meta


def _meta(kind, ndim, dtype):
    """A zero-size array of ``dtype`` and ``ndim`` of the chunk type ``kind`` (a ``_meta``)."""
    return backend_for(kind)[0].empty(kind, (0,) * ndim, dtype)


def _known_shape(arr, argname):
    if any(isinstance(d, float) and math.isnan(d) for d in arr.shape):
        raise ValueError(f"{argname} has unknown chunk sizes (shape {arr.shape}); call "
                         f"{argname}.compute_chunk_sizes() first")


def _indices(ndim):
    return tuple(f"d{i}" for i in range(ndim))


def group_chunks(chunks, g):
    """Chunks along a grouped axis with every chunk but the last a multiple of ``g``.

    Aligned chunks are kept; otherwise each boundary moves down to a multiple of
    ``g`` (the remainder stays in the last chunk; chunks that vanish are dropped).

    >>> group_chunks((8, 8, 3), 4)
    (8, 8, 3)
    >>> group_chunks((5, 5, 5, 3), 4)
    (4, 4, 4, 6)
    >>> group_chunks((3, 3), 4)
    (6,)
    """
    chunks = tuple(int(c) for c in chunks)
    if all(c % g == 0 for c in chunks[:-1]):
        return chunks
    n, bounds, pos = sum(chunks), [0], 0
    for c in chunks[:-1]:
        pos += c
        b = pos // g * g
        if bounds[-1] < b < n:
            bounds.append(b)
    bounds.append(n)
    return tuple(e - s for s, e in zip(bounds[:-1], bounds[1:]))


def _align_groups(src, scheme):
    """``src`` rechunked so that no group or block straddles a chunk: along each dim whose
    block is more than 1, chunk boundaries move down to multiples of it."""
    if scheme.kind not in ("group", "block"):
        return src
    # A block covering its whole dim needs that dim in one chunk (group_chunks makes it one).
    target = {d: group_chunks(src.chunks[d], b) for d, b in enumerate(scheme.blocks) if b > 1}
    changed = {d: c for d, c in target.items() if c != src.chunks[d]}
    return src.rechunk(changed) if changed else src


def _param_chunks(scheme, chunks):
    """The chunks of scales/zps that line up with data chunks ``chunks``."""
    if scheme.kind == "tensor":
        return ()
    if scheme.kind in ("group", "block"):
        # Aligned (_align_groups): each chunk holds whole blocks, the last one ragged.
        return tuple(tuple(-(-c // b) for c in cs) for cs, b in zip(chunks, scheme.blocks))
    return tuple(chunks[a] for a in scheme.axes)


def _param_indices(scheme, ind):
    if scheme.kind == "tensor":
        return ()
    if scheme.kind in ("group", "block"):
        return ind
    return tuple(ind[a] for a in scheme.axes)


def _first(v):
    """The one block of a contraction over single-chunk axes (``concatenate=False`` lists)."""
    while isinstance(v, list):
        (v,) = v
    return v


def _device(block):
    """A context: ``block``'s device for CuPy chunks, nothing for NumPy ones."""
    if isinstance(block, np.ndarray):
        return _Nothing()
    import cupy

    return cupy.cuda.Device(block.device.id)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- quantize / dequantize ---------------------------------------------------------------------------

def _elementwise(public, name, src, a):
    import dask.array as da

    if a["out"] is not None:
        raise TypeError(_NO_OUT)
    codes = None  # dequantize of Codes: the row of its code dtype; the Dask array is its data
    if isinstance(src, Codes):
        codes, src = code_type(src.dtype), src.data
    kind = _chunk_kind(src, "src")
    _known_shape(src, "src")
    storage = backend_for(_meta(kind, 0, np.uint8))[0].code_storage
    in_codes = False
    if name == "quantize":
        fdtype = native(src.dtype)
        if fdtype not in FLOAT_DTYPES:
            raise TypeError(f"src must be float16, float32, float64 or bfloat16 to quantize, got {src.dtype}")
        code = as_code_type("int8" if a["dtype"] is None else a["dtype"])
        rdtype, in_codes = storage(code)
        ct = compute_dtype(fdtype)
    else:
        code = codes or code_type(src.dtype)
        if code is None:
            raise TypeError(f"src must be int8 or uint8 codes, an fp8 array or gpuq.Codes to "
                            f"dequantize, got {src.dtype}")
        rdtype = np.dtype(np.float32) if a["dtype"] is None else as_dtype(a["dtype"], "dtype", FLOAT_DTYPES)
        ct = compute_dtype(rdtype)
    scheme = Scheme.build(src.shape, a["axis"], a["group_size"], a["block_size"])
    src = _align_groups(src, scheme)
    pchunks = _param_chunks(scheme, src.chunks)
    check = a["check_values"]
    s = _param(a["scales"], "scales", scheme, ct, kind, pchunks, check, code)
    z = _param(a["zps"], "zps", scheme, ct, kind, pchunks, check, code)
    ind = _indices(src.ndim)
    pind = _param_indices(scheme, ind)
    args = [src, ind]
    for p in (s, z):
        args += [p, pind if isinstance(p, da.Array) else None]
    kw = dict(axis=a["axis"], group_size=a["group_size"], block_size=a["block_size"], check_values=check)
    if name == "quantize":
        kw["dtype"], kw["saturate"] = code.name, a["saturate"]
    else:
        kw["dtype"] = rdtype
    fn = functools.partial(_apply, public, rdtype, codes.name if codes else None, in_codes, **kw)
    result = da.blockwise(fn, ind, *args, dtype=rdtype, meta=_meta(kind, src.ndim, rdtype),
                          align_arrays=False, token=f"gpuq-{name}")
    # CuPy has no fp8 dtype: fp8 codes of CuPy chunks are Codes of their bits, as in memory.
    return Codes(result, tuple(result.shape), code.name) if in_codes else result


def _apply(public, rdtype, codes, in_codes, block, scales, zps, **kwargs):
    """One chunk's call: ``block`` (wrapped as the Codes of its bits where ``codes`` names their
    code dtype), the chunk's result (the bits of Codes results where ``in_codes``)."""
    with _threads_shared():
        out = _host_out(block, rdtype)
        src = block if codes is None else Codes(block, block.shape, codes)
        result = public(src, scales, zps, out=out, **kwargs)
    return result.data if in_codes else result


_running = 0
_running_lock = threading.Lock()


@contextlib.contextmanager
def _threads_shared():
    """Run one chunk with its share of gpuq's host threads: the process's threads
    (``gpuq.get_num_threads()``; in a ``distributed`` worker, at most the worker's
    threads) divided by the gpuq chunk tasks running when this one starts.

    Why: Dask runs a worker's tasks on threads of its own, as many at once as the
    worker has threads (one per core by default). If each task's call also started
    all of gpuq's threads, N tasks would run N x N threads on N cores: on 2 cores,
    64 MiB chunks took 1.29x the in-memory call that way against 1.04x with one
    thread each (bench/NOTES.md). A worker's threads are the cores Dask gave it
    (2 workers of 1 thread on 2 cores: 1 each), as Dask's nanny sets
    ``OMP_NUM_THREADS=1`` for other libraries. A task that runs alone (the
    synchronous scheduler, the last chunks) keeps all of them. The bits do not
    depend on the thread count.
    """
    global _running
    from .backends.host.threads import get_num_threads, thread_share

    total = get_num_threads()
    worker = _worker_threads()
    if worker:
        total = min(total, worker)
    with _running_lock:
        _running += 1
        share = total // _running
    try:
        with thread_share(max(1, share)):
            yield
    finally:
        with _running_lock:
            _running -= 1


def _worker_threads():
    """The thread count of the ``distributed`` worker running this task, or None outside one."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        return distributed.get_worker().state.nthreads
    except ValueError:  # not in a worker's task
        return None


#: NumPy chunk outputs at least this large get their own huge-page-advised mapping (:func:`_host_out`).
HUGE_OUT_MIN = 4 << 20


def _host_out(block, dtype):
    """The output of one NumPy chunk: a fresh anonymous mapping advised for transparent huge
    pages (Linux), or None (gpuq allocates: CuPy chunks, small chunks, other systems).

    Why: a worker allocates one output per chunk and holds it. Chunk-sized outputs below
    glibc's mmap ceiling (32 MiB: a 16 MiB int8 output of a 64 MiB float32 chunk) come from
    malloc's heaps in 4 KiB pages, so writing each output costs ~4000 page faults, where
    the in-memory call's one big output is a fresh mapping in 2 MiB pages: on 2 cores,
    quantizing 29 chunks of 64 MiB and holding the outputs took 86-88 ms against 63-66 ms
    for the whole call, and 74-76 ms with outputs in such mappings (bench/NOTES.md). The
    mapping is unmapped when the array is freed; the bits are the same either way."""
    n = block.size * dtype.itemsize
    if not _HUGE_PAGES or not isinstance(block, np.ndarray) or n < HUGE_OUT_MIN:
        return None
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # pragma: no cover - THP off or unsupported: still a fresh mapping
        pass
    return np.frombuffer(m, dtype, count=block.size).reshape(block.shape)


#: Whether this system can advise a mapping for transparent huge pages (Linux).
_HUGE_PAGES = sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")


def _param(obj, argname, scheme, ct, kind, pchunks, check_values, code):
    """Scales or zps, checked now as far as they can be, as a Dask array lined up with the data
    (per-tensor: a 0-d one, or the checked host value itself); None for absent zps."""
    import dask.array as da

    scales = argname == "scales"
    if obj is None and not scales:
        return None
    if isinstance(obj, da.Array):
        pkind = _chunk_kind(obj, argname)
        if is_device_array(pkind) and not is_device_array(kind):
            raise TypeError(f"{argname} has CuPy (device) chunks but src has NumPy chunks; gpuq does not "
                            f"copy between host and device behind your back")
        _known_shape(obj, argname)
        if scales and obj.dtype.kind != "f":
            raise TypeError(f"{argname} must be a floating array (float32), got {obj.dtype}")
        if not scales and obj.dtype.kind not in "iu":
            raise TypeError(f"{argname} must be integers (int8, uint8 or int32), got {obj.dtype}")
        check_shape(obj, scheme, argname)
        if scheme.kind == "tensor":
            return obj.reshape(()).rechunk(())
        # map_blocks/blockwise pair blocks by position: the parameters take the data's chunks.
        return obj if obj.chunks == pchunks else obj.rechunk(pchunks)
    if is_device_array(kind) and is_device_array(obj):
        # A device array: its dtype and shape now, its values on the device per chunk (check_values).
        dev = backend_for(obj, argname)[1]
        if scales and dev.dtype.kind != "f":
            raise TypeError(f"{argname} must be a floating array (float32), got {dev.dtype}")
        if not scales and dev.dtype.kind not in "iu":
            raise TypeError(f"{argname} must be integers (int8, uint8 or int32), got {dev.dtype}")
        check_shape(dev, scheme, argname)
        dev = dev.reshape(scheme.param_shape)
        if scheme.kind == "tensor":
            return dev
        return da.from_array(dev, chunks=pchunks, asarray=False, meta=_meta(kind, dev.ndim, dev.dtype),
                             name=f"gpuq-{argname}-{uuid.uuid4().hex}")
    # Host values: gpuq's own checks, all of them, now (a device array with NumPy chunks: TypeError).
    backend = backend_for(_meta(kind, 0, np.uint8))[0]
    if scales:
        host = scales_param(obj, scheme, ct, backend, argname=argname)
    else:
        host = zps_param(obj, code, scheme, backend, argname=argname)
        if host is None:  # zeros of a code type without zero points
            return None
    if scheme.kind == "tensor":
        return host
    return da.from_array(host, chunks=pchunks)


# --- choose_qparams / quantize_dynamic ------------------------------------------------------------------

def _qparams(public, name, x, a):
    import dask.array as da

    kind = _chunk_kind(x, "x")
    _known_shape(x, "x")
    # gpuq's own argument checks, with the in-memory messages, on a stand-in of x's dtype and
    # shape (zero strides): nothing is computed, so no parameter of a stand-in's data can fail.
    validate(np.broadcast_to(np.zeros((), x.dtype), x.shape), a["axis"], a["group_size"], a["block_size"],
             a["dtype"], a["symmetric"], a.get("eps"), a["scale_dtype"], a["method"],
             a.get("scale_rule"))
    code = as_code_type(a["dtype"])
    symmetric = code.zero_point == "none" if a["symmetric"] is None else bool(a["symmetric"])
    no_zps = code.zero_point == "none" or (symmetric and code.symmetric_zp == 0)
    qdtype, in_codes = backend_for(_meta(kind, 0, np.uint8))[0].code_storage(code)
    scheme = Scheme.build(x.shape, a["axis"], a["group_size"], a["block_size"])
    x = _align_groups(x, scheme)
    ind = _indices(x.ndim)
    pind = _param_indices(scheme, ind)
    pchunks = _param_chunks(scheme, x.chunks)
    reduced = [d for d in range(x.ndim) if scheme.kind == "tensor" or d not in scheme.axes]
    if scheme.kind in ("group", "block"):  # aligned: every block inside one chunk
        reduced = []
    if a["method"] != "minmax" and any(len(x.chunks[d]) > 1 for d in reduced):
        # The search needs each block's elements together (its errors are sums over the block
        # in C order, not a min/max a tree can combine): the dims a block spans become one chunk.
        x = x.rechunk({d: -1 for d in reduced})
    dynamic = name == "quantize_dynamic"
    if all(len(x.chunks[d]) == 1 for d in reduced):
        # Every block inside one chunk: each chunk is one in-memory call.
        inter = da.blockwise(functools.partial(_call_tuple, public, a), ind, x, ind,
                             dtype=x.dtype, meta=_meta(kind, x.ndim, x.dtype), align_arrays=False,
                             token=f"gpuq-{name}-chunk")
        outs = []
        if dynamic:
            outs.append(_codes_of(_pick(inter, ind, 0, ind, {}, qdtype, kind), code, in_codes))
        first = 1 if dynamic else 0
        adjust = {}
        if scheme.kind in ("group", "block"):  # a chunk's parameters: its blocks, per dim
            adjust = {ind[d]: pchunks[d] for d in range(x.ndim) if pchunks[d] != x.chunks[d]}
        outs.append(_pick(inter, ind, first, pind, adjust, np.float32, kind))
        outs.append(None if no_zps else _pick(inter, ind, first + 1, pind, adjust, np.int32, kind))
        return tuple(outs)
    lohi = _tree(x, scheme, kind, ind, reduced)
    # (2,) + keepdims shape -> the parameters, slot by slot, with gpuq's own formula.
    pdims = ("lohi",) + ind
    kept = () if scheme.kind == "tensor" else scheme.axes
    inter = da.blockwise(functools.partial(_finish, public, a, kept), pind, lohi, pdims,
                         concatenate=False, dtype=np.float32, meta=_meta(kind, len(pind), np.float32),
                         align_arrays=False, token=f"gpuq-{name}-finish")
    first = 1 if dynamic else 0
    scales = _pick(inter, pind, first, pind, {}, np.float32, kind)
    zps = None if no_zps else _pick(inter, pind, first + 1, pind, {}, np.int32, kind)
    if not dynamic:
        return scales, zps
    axis = None if scheme.kind == "tensor" else scheme.axes
    args = [x, ind, scales, pind] + ([zps, pind] if zps is not None else [None, None])
    q = da.blockwise(functools.partial(_quantize_chunk, axis=axis, code=code), ind, *args,
                     dtype=qdtype, meta=_meta(kind, x.ndim, qdtype), align_arrays=False,
                     token="gpuq-quantize_dynamic-codes")
    return _codes_of(q, code, in_codes), scales, zps


def _call_tuple(public, kwargs, block):
    with _threads_shared():
        return tuple(r.data if isinstance(r, Codes) else r for r in public(block, **kwargs))


def _codes_of(q, code, in_codes):
    """Codes held as their bits (CuPy fp8) come back as the Codes of the Dask array of bits."""
    return Codes(q, tuple(q.shape), code.name) if in_codes else q


def _pick(inter, inter_ind, i, out_ind, adjust, dtype, kind):
    import dask.array as da

    return da.blockwise(functools.partial(_item, i=i), out_ind, inter, inter_ind, concatenate=False,
                        adjust_chunks=adjust or None, dtype=dtype, meta=_meta(kind, len(out_ind), dtype),
                        align_arrays=False, token=f"gpuq-pick{i}")


def _item(v, i):
    return _first(v)[i]


def _tree(x, scheme, kind, ind, reduced):
    """Per-slot (min, max) of ``x``: a float32 array of shape ``(2,) + x.shape`` with 1 on
    reduced dims, combined over chunks in a tree; an empty slot is ``(+inf, -inf)``. float64
    data's min and max are rounded to float32 per chunk: rounding is monotone, so the global
    ones are the rounded global min and max, as the parameters use them."""
    import dask.array as da

    pdtype = np.dtype(np.float32)
    axis = None if scheme.kind == "tensor" else scheme.axes
    part = da.blockwise(functools.partial(_partial, axis=axis, dtype=pdtype), ("lohi",) + ind, x, ind,
                        new_axes={"lohi": 2}, adjust_chunks={ind[d]: 1 for d in reduced},
                        dtype=pdtype, meta=_meta(kind, x.ndim + 1, pdtype), align_arrays=False,
                        token="gpuq-minmax")
    return da.reduction(part, _identity, _combine, axis=tuple(d + 1 for d in reduced), keepdims=True,
                        dtype=pdtype, combine=_combine, concatenate=False,
                        meta=_meta(kind, x.ndim + 1, pdtype), name="gpuq-minmax-tree")


def _partial(block, axis, dtype):
    """One chunk's per-slot ``(lo, hi)`` as ``(2,) + keepdims`` floats, a slot with no number
    as ``(+inf, -inf)`` (the identities of the tree's min and max)."""
    backend, b = backend_for(block, "x")
    scheme = Scheme.build(b.shape, axis)
    keep = tuple(s if scheme.kind != "tensor" and d in scheme.axes else 1 for d, s in enumerate(b.shape))
    with _device(b), _threads_shared():
        lo, hi = (v.astype(dtype).reshape(keep) for v in backend.minmax(b, scheme))  # widen exactly
        out = backend.empty(b, (2,) + keep, dtype)
        out[0] = _where_bits(lo, lo != lo, _POS_INF)
        out[1] = _where_bits(hi, hi != hi, _NEG_INF)
    return out


#: float32 bit patterns: +inf, -inf, +0.0.
_POS_INF, _NEG_INF, _ZERO = 0x7F800000, 0xFF800000, 0


def _where_bits(a, mask, bits):
    """float32 ``a`` with the float32 of ``bits`` where ``mask``: a select in unsigned arithmetic
    modulo 2**32 (exact for every pattern, NaN and Inf included), which every chunk type has."""
    u = a.view(np.uint32)
    return (u + mask.astype(np.uint32) * (np.uint32(bits) - u)).view(np.float32)


def _identity(p, axis=None, keepdims=True):
    return p


def _flatten(v):
    if isinstance(v, list):
        for item in v:
            yield from _flatten(item)
    else:
        yield v


def _combine(parts, axis=None, keepdims=True):
    """Min of the lows, max of the highs over nested lists of partials (keepdims shapes)."""
    parts = list(_flatten(parts))
    first = parts[0]
    if len(parts) == 1:
        return first
    with _device(first):
        stack = backend_for(first)[0].empty(first, (len(parts),) + first.shape, first.dtype)
        for i, p in enumerate(parts):
            stack[i] = p
        out = stack[0].copy()
        out[0] = stack[:, 0].min(axis=0)
        out[1] = stack[:, 1].max(axis=0)
    return out


def _finish(public, kwargs, kept, v):
    """Scales and zps of one chunk of slots from their global (min, max): the in-memory call on
    the array ``[lo, hi]`` of each slot, which gives the same parameters bit for bit (they
    depend on a block's min and max only; an empty slot is an all-zero one).

    ``kept``: the dims of the keepdims block that hold slots (the scheme's axes; per-tensor none).
    """
    b = _first(v)
    pshape = tuple(b.shape[1 + d] for d in kept)
    with _device(b):
        lo, hi = b[0].reshape(pshape), b[1].reshape(pshape)
        t = backend_for(b)[0].empty(b, (2,) + pshape, b.dtype)
        empty = lo > hi
        t[0] = _where_bits(lo, empty, _ZERO)
        t[1] = _where_bits(hi, empty, _ZERO)
        axis = None if not kept else (1 if len(kept) == 1 else tuple(range(1, len(kept) + 1)))
        result = public(t, **dict(kwargs, axis=axis, group_size=None))
        return tuple(r.data if isinstance(r, Codes) else r for r in result)


def _quantize_chunk(src, scales, zps, *, axis, code):
    """One chunk's codes from parameters this module computed (``quantize_dynamic``, tree path):
    what ``gpuq.quantize`` does with them (the same validation helpers and backend call), on the
    chunk's device and CuPy's current stream there; fp8 codes of CuPy chunks as their bits."""
    backend, arr = backend_for(src, "x")
    with _device(arr):
        scheme = Scheme.build(arr.shape, axis)
        ct = compute_dtype(native(arr.dtype))
        # gpuq's own parameters, not checked again (check_values=False may have left a scale +Inf).
        s = scales.astype(ct, copy=False).reshape(scheme.param_shape)
        z = None if zps is None or code.zero_point == "none" else zps.reshape(scheme.param_shape)
        out = backend.empty(arr, arr.shape, backend.code_storage(code)[0])
        if arr.size:
            with _threads_shared():
                backend.quantize(code, arr, scheme, backend.to_param(s, arr), backend.to_param(z, arr), out,
                                 True)
    return out
