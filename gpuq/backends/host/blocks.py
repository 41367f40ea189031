"""Cutting a broadcast problem into cache-sized blocks.

A problem is ``x`` (src view), ``o`` (out view, same shape) and parameter
arrays broadcastable to ``x`` (scales, zero points). The parameters vary
along some dims ("scale dims") and are constant along the others.

Three block layouts:

* flat: ``x`` and ``o`` are contiguous and the parameters vary along at most
  one merged dim, so the problem is ``(outer, C, inner)`` with parameter
  index ``c`` -- per-tensor, per-channel on any axis, adjacent multi-axis,
  and per-group along the last axis. Blocks are contiguous 1-D ranges; for
  the ufunc loop the parameters of a block are a scalar, a column (rows of
  ``inner`` elements), or, where ``inner`` is too short for NumPy's inner
  loop, expanded to one value per element into per-thread scratch (a tiled
  pattern or a gather); for the compiled kernels they come as :class:`Runs`.
* rows (the compiled kernels only): ``x`` or ``o`` is not contiguous, but
  its trailing dims are: contiguous rows at a larger stride, e.g. the whole
  groups ``x[:, :14336]`` of a ragged ``(4160, 14400)`` tensor, or a view of a
  wider array. Blocks are ranges of rows (:class:`Rows`); the kernels walk
  the rows themselves and run their flat loop on each (``loops.*_rows``), so
  a ragged scheme costs what its element count costs.
* n-d: anything else (rows that are not contiguous, parameters varying along
  several non-adjacent dims of a contiguous tensor). Blocks are n-d sub-views
  and NumPy broadcasts; the compiled path takes those that :func:`runs` can
  flatten.

Every layout hands the same block function the same kind of arguments, so the
arithmetic lives in one place per loop (``backend``, ``loops``).
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

#: Elements per block. Each block costs a handful of ufunc calls, and on this
#: project's 2-vCPU machines every call is a GIL hand-off between the worker
#: threads that takes about as long as a small call's work, so blocks must be
#: long: 1 << 19 (2 MiB of float32 scratch per thread, served from L2/L3) was
#: measured best overall at 64M elements on 2 threads (bench/NOTES.md; 1 << 17:
#: 38 ms per-tensor quantize, 1 << 19: 25 ms; 1 << 20 slows the short-row layouts).
BLOCK = 1 << 19
#: Shortest row worth a NumPy inner loop; shorter rows expand their parameters
#: (rows of 64+ broadcast faster than a gather, bench/NOTES.md).
INNER_MIN = 64
#: The compiled kernels: runs shorter than this become one parameter per element, and a
#: parameter pattern shorter than PERIOD_MIN is tiled to at least that length: a loop
#: of a few elements does not vectorize (period 3: ~10x slower than tiled, measured).
RUN_MIN = 16
PERIOD_MIN = 1024
#: ... except in blocks of at most this many elements (small tensors: per-call latency).
#: Contiguous tensors this small with one flat parameter run also skip the block plans
#: (``backend._small_call``).
SMALL = 1 << 14
#: Shortest row of a :class:`RowsPlan`: the kernels run their flat loop once per row, which
#: costs more than the ufuncs' 2-D loop on shorter rows (16: 2x slower, 32: even, measured).
ROW_MIN = 32


class Runs(NamedTuple):
    """A flat block in the compiled kernels' form: element ``i`` uses ``params[k][(i // run) % P]``."""

    run: int
    params: list


class Rows(NamedTuple):
    """A block of rows at a stride in the compiled kernels' form (:class:`RowsPlan`).

    ``layout`` is ``(shape, strides, first, last, length, count)`` as ``loops.*_rows``
    take it: rows ``first .. last - 1`` of the outer index space ``shape`` (C order);
    the row at coordinates ``c`` holds ``length`` elements from element ``c @ strides[:, 0]``
    of the flat src span and ``c @ strides[:, 1]`` of the out span, and its parameters are
    ``params[k][p:p + count]`` with ``p = c @ strides[:, 2]``, taken as ``runs`` within it.
    """

    runs: Runs
    layout: tuple


def lower(x, o, params):
    """Drop size-1 dims and merge neighbouring dims that can be merged.

    Two dims merge when src and out are contiguous across them and every
    parameter either varies along both (and is contiguous across them) or
    along neither. Returns ``(shape, x, o, params, scale_dims)``.
    """
    keep = [i for i, d in enumerate(x.shape) if d != 1]
    shape = [x.shape[i] for i in keep]
    xs = [x.strides[i] for i in keep]
    os_ = [o.strides[i] for i in keep]
    pst = [[(p.shape[i], p.strides[i]) for i in keep] for p in params]
    j = 0
    while j + 1 < len(shape):
        mergeable = (
            xs[j] == xs[j + 1] * shape[j + 1]
            and os_[j] == os_[j + 1] * shape[j + 1]
            and all(_param_mergeable(ps[j], ps[j + 1]) for ps in pst)
        )
        if mergeable:
            shape[j] *= shape[j + 1]
            xs[j], os_[j] = xs[j + 1], os_[j + 1]
            for ps in pst:
                (d0, _), (d1, s1) = ps[j], ps[j + 1]
                ps[j] = (d0 * d1, s1)
                del ps[j + 1]
            del shape[j + 1], xs[j + 1], os_[j + 1]
        else:
            j += 1
    shape = tuple(shape)
    x2, o2 = view(x, shape), view(o, shape)
    p2 = [p.reshape([d for d, _ in ps]) for p, ps in zip(params, pst)]
    scale_dims = sorted({i for p in p2 for i, d in enumerate(p.shape) if d > 1})
    return shape, x2, o2, p2, scale_dims


def view(a, shape):
    """``a.reshape(shape)`` that must not copy: writes into a copy would be lost.

    Every reshape asked for here (dropping size-1 dims, merging dims whose
    strides chain, splitting one dim) has a view, so NumPy returns one; the
    cheap bounds check guards the promise.
    """
    if a.shape == shape:
        return a
    v = a.reshape(shape)
    if a.size and not np.may_share_memory(v, a):
        raise RuntimeError(f"gpuq internal error: reshaping {a.shape} to {shape} copied")
    return v


def _param_mergeable(a, b) -> bool:
    (da, sa), (db, sb) = a, b
    if da == 1 and db == 1:
        return True
    return da > 1 and db > 1 and sa == sb * db


class FlatPlan:
    """Blocks of a contiguous ``(outer, C, inner)`` problem, ``params`` 1-D of length C.

    With ``expand=True`` (the ufunc loop) a block's parameters broadcast
    against it. With ``expand=False`` (the compiled kernels, which index
    parameters themselves) every block is 1-D and its parameters come as
    :class:`Runs`: rows are runs of ``inner``, a "pattern" is one period
    tiled to at least ``PERIOD_MIN`` elements (not to a whole block), and
    only rows shorter than ``RUN_MIN`` are expanded to one value per element.
    """

    def __init__(self, x, o, params, outer, channels, inner, expand=True):
        self.x = view(x, (x.size,))
        self.o = view(o, (o.size,))
        self.size = self.x.size
        self.params = params
        self.outer, self.channels, self.inner = outer, channels, inner
        self.expand = expand
        n = outer * channels * inner
        if channels == 1:
            self.mode, self.step = "scalar", BLOCK
            self.params = [p.reshape(()) for p in params]
            self.nblocks = -(-n // BLOCK)
        elif inner >= BLOCK:
            # One channel's row is longer than a block: chunks of a row, scalar params.
            self.mode = "rowchunk"
            self.chunks = -(-inner // BLOCK)
            self.nblocks = outer * channels * self.chunks
        elif inner >= INNER_MIN:
            # Several whole rows per block, a column of params.
            self.mode = "rows"
            self.rows_per_block = BLOCK // inner
            self.nblocks = -(-(outer * channels) // self.rows_per_block)
            self.x2 = self.x.reshape(outer * channels, inner)
            self.o2 = self.o.reshape(outer * channels, inner)
        elif channels * inner <= BLOCK:
            # Short rows, short period: the params pattern of whole periods, tiled once.
            period = channels * inner
            self.mode = "pattern"
            if not expand:
                period *= -(-PERIOD_MIN // period)
            self.step = max(1, BLOCK // period) * period
            reps = self.step // (channels * inner) if expand else period // (channels * inner)
            self.patterns = [np.tile(np.repeat(p, inner), reps) for p in params]
            self.nblocks = -(-n // self.step)
        else:
            # Short rows, many channels: expand each block's params into scratch
            # (a broadcasting copy: ~6x faster than np.take with an index).
            self.mode = "gather"
            self.channels_per_block = BLOCK // inner
            self.cblocks = -(-channels // self.channels_per_block)
            self.nblocks = outer * self.cblocks

    def block(self, b, scratch):
        """The views and parameter values of block ``b``."""
        mode = self.mode
        if mode == "scalar" or mode == "pattern":
            lo = b * self.step
            hi = min(lo + self.step, self.x.size)
            if mode == "scalar":
                params = Runs(hi - lo, [p.reshape(1) for p in self.params]) if not self.expand else self.params
                return self.x[lo:hi], self.o[lo:hi], params
            if not self.expand:
                return self.x[lo:hi], self.o[lo:hi], Runs(1, self.patterns)
            return self.x[lo:hi], self.o[lo:hi], [p[: hi - lo] for p in self.patterns]
        if mode == "rowchunk":
            row, chunk = divmod(b, self.chunks)
            lo = row * self.inner + chunk * BLOCK
            hi = min(lo + BLOCK, (row + 1) * self.inner)
            c = row % self.channels
            if not self.expand:
                return self.x[lo:hi], self.o[lo:hi], Runs(hi - lo, [p[c:c + 1] for p in self.params])
            return self.x[lo:hi], self.o[lo:hi], [p[c] for p in self.params]
        if mode == "rows":
            r0 = b * self.rows_per_block
            r1 = min(r0 + self.rows_per_block, self.outer * self.channels)
            chans = np.arange(r0, r1) % self.channels
            if not self.expand:
                lo, hi = r0 * self.inner, r1 * self.inner
                return self.x[lo:hi], self.o[lo:hi], Runs(self.inner, [p[chans] for p in self.params])
            return self.x2[r0:r1], self.o2[r0:r1], [p[chans][:, None] for p in self.params]
        outer_i, cb = divmod(b, self.cblocks)
        c0 = cb * self.channels_per_block
        c1 = min(c0 + self.channels_per_block, self.channels)
        lo = (outer_i * self.channels + c0) * self.inner
        hi = lo + (c1 - c0) * self.inner
        if not self.expand and self.inner >= RUN_MIN:
            return self.x[lo:hi], self.o[lo:hi], Runs(self.inner, [p[c0:c1] for p in self.params])
        expanded = []
        for i, p in enumerate(self.params):
            buf = scratch.buffer(("param", i), p.dtype, hi - lo)
            np.copyto(buf.reshape(c1 - c0, self.inner), p[c0:c1, None])
            expanded.append(buf)
        return self.x[lo:hi], self.o[lo:hi], Runs(1, expanded) if not self.expand else expanded


class NdPlan:
    """Blocks of a general broadcast problem: n-d sub-views of at most ~BLOCK elements."""

    def __init__(self, x, o, params):
        self.blocks = []
        self.size = x.size
        shape = x.shape
        if x.size <= BLOCK:
            self.blocks.append((x, o, params))
            self.nblocks = 1
            return
        # The longest trailing sub-tensor that fits a block ends at dim d:
        # chunk along d, iterate over every index of the dims before it.
        tail = 1
        d = len(shape) - 1
        while d >= 0 and tail * shape[d] <= BLOCK:
            tail *= shape[d]
            d -= 1
        step = max(1, BLOCK // tail)
        for idx in itertools.product(*(range(n) for n in shape[:d])):
            for a in range(0, shape[d], step):
                sl = idx + (slice(a, a + step),)
                ps = [p[tuple(i if p.shape[j] > 1 else 0 for j, i in enumerate(idx))
                        + (slice(a, a + step) if p.shape[d] > 1 else slice(None),)]
                      for p in params]
                self.blocks.append((x[sl], o[sl], ps))
        self.nblocks = len(self.blocks)

    def block(self, b, scratch):
        return self.blocks[b]


def runs(x, o, params):
    """A block as flat runs: ``(x1, o1, Runs(run, params1))``, or None for other layouts.

    Element ``i`` of ``x1`` uses ``params1[k][(i // run) % P]``. That covers
    every contiguous block whose parameters vary along one range of
    consecutive dims (per-tensor, the rows of a per-channel block, a
    parameter pattern of whole periods); short runs and periods are widened
    as in :class:`FlatPlan` (``expand=False``).

    >>> x = np.zeros((2, 3, 40), np.float32)
    >>> _, _, (run, (p,)) = runs(x, x, [np.arange(3.0).reshape(1, 3, 1)])
    >>> run, p
    (40, array([0., 1., 2.]))
    """
    if not (x.flags.c_contiguous and o.flags.c_contiguous):
        return None
    ps = [np.asarray(p) for p in params]
    shape = ps[0].shape
    if any(p.shape != shape for p in ps):
        return None
    if ps[0].size == 1:
        run = x.size
    else:
        if len(shape) > x.ndim:
            return None
        run = _row_run(x.shape, (1,) * (x.ndim - len(shape)) + shape)
        if run is None:
            return None
    flat = [np.ascontiguousarray(p).reshape(1, -1) for p in ps]
    if x.size > SMALL:  # widening costs more than it saves on a few thousand elements (measured)
        flat, run = _widened(flat, run)
    return x.reshape(-1), o.reshape(-1), Runs(run, [p.reshape(-1) for p in flat])


def _widened(rows, run):
    """Parameter rows ``(M, count)`` (each row of elements uses one row of parameters, element
    ``j`` the ``(j // run) % count``-th) in the form the kernels loop fastest:

    runs shorter than ``RUN_MIN`` repeated to one parameter per element, then patterns of one
    parameter per element shorter than ``PERIOD_MIN`` tiled. Returns ``(rows, run)``; the
    rows stay as they are where widening would make them longer than a block (memory).
    """
    m, count = rows[0].shape
    widen = run < RUN_MIN
    width = count * run if widen else count
    tile = -(-PERIOD_MIN // width) if (widen or run == 1) and width < PERIOD_MIN else 1
    if (widen or tile > 1) and m * width * tile > BLOCK:
        return rows, run
    if widen:
        rows, run = [np.repeat(p, run, axis=1) for p in rows], 1
    if tile > 1:
        rows = [np.tile(p, (1, tile)) for p in rows]
    return rows, run


class RowsPlan:
    """Blocks of a problem whose trailing dims are contiguous rows at a stride, for the compiled
    kernels: each block is a range of whole rows of about ``BLOCK`` elements (:class:`Rows`),
    ``x`` and ``o`` flat spans over the problem's memory.

    Built by :meth:`of`, which says where the form fits. The kernels find a row's start from
    its index (``loops.row_starts``): a block costs no NumPy call, and no index array of the
    tensor's size is ever made.
    """

    def __init__(self, x, o, k, runs, count, pstrides):
        self.size = x.size
        self.x, self.o = _span(x), _span(o)
        self.runs, self.count = runs, count
        self.shape = np.array(x.shape[:k], np.int64)
        self.strides = np.array([[_elements(x, d), _elements(o, d), pstrides[d]] for d in range(k)],
                                np.int64).reshape(k, 3)
        self.length = math.prod(x.shape[k:])
        self.nrows = math.prod(x.shape[:k])
        # Rows shared evenly among the ~BLOCK-sized blocks (not BLOCK // length rows each and a
        # short last block): the threads take whole blocks.
        self.rows_per_block = -(-self.nrows // -(-x.size // BLOCK))
        self.nblocks = -(-self.nrows // self.rows_per_block)

    @classmethod
    def of(cls, x, o, params):
        """The plan, or None where the problem is not rows at a stride the kernels take: rows
        (trailing dims contiguous in ``x`` and ``o``, at most ``BLOCK`` elements, parameters
        one flat run within a row) shorter than ``ROW_MIN``, or a negative or unaligned stride."""
        ps = [np.asarray(p) for p in params]
        shape = ps[0].shape
        if not x.size or len(shape) > x.ndim or any(p.shape != shape for p in ps):
            return None
        if not (_forward(x) and _forward(o)):
            return None
        pshape = (1,) * (x.ndim - len(shape)) + shape
        for k in range(_contiguous_from(x, o), x.ndim):
            run = _row_run(x.shape[k:], pshape[k:])
            if math.prod(x.shape[k:]) <= BLOCK and run is not None:
                break
        else:
            return None
        if math.prod(x.shape[k:]) < ROW_MIN:
            return None
        # The parameters of a row are one row of (params of the outer dims, params of a row).
        wide, run = _widened([np.ascontiguousarray(p).reshape(-1, math.prod(pshape[k:])) for p in ps], run)
        count = wide[0].shape[1]
        pstrides, stride = [], count  # C order: a row's parameters start at its index times count
        for n in reversed(pshape[:k]):
            pstrides.append(stride if n > 1 else 0)
            stride *= n
        return cls(x, o, k, Runs(run, [p.reshape(-1) for p in wide]), count, pstrides[::-1])

    def block(self, b, scratch):
        first = b * self.rows_per_block
        last = min(first + self.rows_per_block, self.nrows)
        return self.x, self.o, Rows(self.runs, (self.shape, self.strides, first, last, self.length, self.count))


def reduction_rows(x, kept):
    """``(span, layout)``: ``x`` as rows at a stride for a kernel that reduces its dims from
    ``kept`` on (``loops.minmax_keys_rows``), or None where those dims are not contiguous (or a
    stride runs backwards).

    A row holds ``x``'s dims from the first dim ``k <= kept`` on which ``x`` is C-contiguous;
    ``layout`` is :class:`Rows`' (its out and parameter strides 0), ``count`` the slots of a row
    (``prod(x.shape[k:kept])``), ``span`` a flat view of ``x``'s memory.

    >>> x = np.zeros((6, 100), np.float32)[:, :64].reshape(6, 4, 16)
    >>> _, (shape, strides, first, last, length, count) = reduction_rows(x, 2)
    >>> shape.tolist(), strides[:, 0].tolist(), (first, last, length, count)
    ([6], [100], (0, 6, 64, 4))
    """
    k = _contiguous_from(x, x)
    if not x.size or k > kept or not _forward(x):
        return None
    strides = np.array([[_elements(x, d), 0, 0] for d in range(k)], np.int64).reshape(k, 3)
    layout = (np.array(x.shape[:k], np.int64), strides, 0, math.prod(x.shape[:k]), math.prod(x.shape[k:]),
              math.prod(x.shape[k:kept]))
    return _span(x), layout


def _forward(a) -> bool:
    """Whether every stride of ``a`` (dims longer than 1) is a non-negative multiple of its items."""
    return all(s >= 0 and s % a.itemsize == 0 for n, s in zip(a.shape, a.strides) if n > 1)


def _elements(a, d) -> int:
    """The stride of ``a`` along dim ``d`` in elements (0 where the dim is 1 long)."""
    return a.strides[d] // a.itemsize if a.shape[d] > 1 else 0


def _contiguous_from(x, o) -> int:
    """The first dim of the longest run of trailing dims that is C-contiguous in ``x`` and ``o``."""
    k, size = x.ndim, 1
    while k > 0 and all(a.shape[k - 1] == 1 or a.strides[k - 1] == size * a.itemsize for a in (x, o)):
        k -= 1
        size *= x.shape[k]
    return k


def _row_run(row, prow):
    """The run of parameters within a row of shape ``row`` whose parameters have shape ``prow``
    (:class:`Runs`: element ``j`` uses parameter ``(j // run) % count``), or None where they
    vary along dims that are not one range matching the row's."""
    varying = [d for d, n in enumerate(prow) if n > 1]
    if not varying:
        return math.prod(row)
    first, last = varying[0], varying[-1] + 1
    if tuple(prow[first:last]) != tuple(row[first:last]):
        return None
    return math.prod(row[last:])


def _span(a):
    """A flat view of ``a``'s memory from its first element to its last (strides non-negative):
    the kernels address rows in it by offsets."""
    extent = 1 + sum((n - 1) * s // a.itemsize for n, s in zip(a.shape, a.strides) if n > 1)
    return np.lib.stride_tricks.as_strided(a, (extent,), (a.itemsize,))


def plan(x, o, params, expand=True):
    """Choose the block layout for one broadcast problem (``expand``: see :class:`FlatPlan`)."""
    contiguous = x.flags.c_contiguous and o.flags.c_contiguous
    if x.size <= BLOCK and (expand or contiguous):
        return NdPlan(x, o, params)  # one block: lowering would cost more than it saves
    shape, x2, o2, p2, scale_dims = lower(x, o, params)
    contiguous = x2.flags.c_contiguous and o2.flags.c_contiguous
    if not (expand or contiguous):
        # Strided rows: the kernels' rows loop, or (rows not contiguous) the ufuncs on n-d blocks.
        rows = RowsPlan.of(x2, o2, p2)
        return rows if rows is not None else NdPlan(x2, o2, p2)
    if contiguous and len(scale_dims) <= 1:
        if not scale_dims:
            return FlatPlan(x2, o2, [p.reshape(()) for p in p2], 1, 1, math.prod(shape), expand)
        (k,) = scale_dims
        outer, inner = math.prod(shape[:k]), math.prod(shape[k + 1:])
        return FlatPlan(x2, o2, [np.ascontiguousarray(p).reshape(-1) for p in p2], outer, shape[k], inner,
                        expand)
    return NdPlan(x2, o2, p2)

