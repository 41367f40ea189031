"""Quantization parameters from data on the host: blocked min/max, then the formula.

Two steps, each in one place:

* :func:`minmax` reduces ``x`` to the smallest and largest number of every
  parameter slot (one slot per scale): rows of contiguous elements in one
  pass of the compiled kernels (integer order keys, :func:`row_minmax`) where
  they serve host arrays, else NumPy reductions on views
  (:func:`nan_skipping_minmax`). NaN is ignored, quiet or signalling, and nothing the size of ``x`` is allocated. The tensor is cut into units of about ``UNIT`` elements; the
  min and the max of a unit are taken back to back so that the second read
  comes from cache. Units are shared among the NumPy backend's threads.
* :func:`finalize` turns the per-slot (min, max) into scales and zero points
  with parameter-sized float32 arithmetic. ``kernels/qparams.cu``
  (``finalize_one``) states the same formula for the GPU, and
  ``loops.finalize_one`` for the fused host kernel (one slot at a
  time, inside the row loop), bit for bit (tested against this one).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..._dtypes import compute_dtype
from . import blocks
from . import choice
from .affine import block_loop, kernel_input, readonly
from .threads import get_num_threads, run_blocks

#: Elements per reduction unit: its min and max pass both run over data in cache.
UNIT = 1 << 17
#: Elements per block of the fused quantize_dynamic (reduce + quantize in cache).
FUSED_BLOCK = 1 << 19

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def choose_qparams(x, scheme, qmin, qmax, symmetric, eps, scale_dtype="float32", check=True):
    """Scales and zero points for host ``x`` (validated by ``gpuq.qparams``); ``check=False``:
    nothing raises, failed blocks get :func:`finalize`'s unchecked parameters."""
    lo, hi = minmax(x, scheme)
    return finalize(lo, hi, qmin, qmax, symmetric, eps, scale_dtype, strict=check, finite=check)


def quantize_dynamic(x, scheme, code, symmetric, eps, scale_dtype="float32", check=True):
    """Codes (the affine one-byte ``code``: int8, uint8), scales and zps in one pass over ``x``
    where every scale covers one
    contiguous row of C-order ``x`` (per-row / per-token, per-group along the last
    axis); None elsewhere (the caller then runs choose_qparams and quantize).

    With the compiled kernels, ``loops.quantize_dynamic_rows`` does each
    row in one pass (reduce, finalize, codes from L1). Otherwise each block of
    rows is reduced, turned into qparams by :func:`finalize` and quantized by the
    ufunc block function while it is still in cache. Either way ``x`` is read
    from memory once, with the same bits as choose_qparams then quantize. ``check=False``:
    nothing raises, failed rows get :func:`finalize`'s unchecked parameters and their codes.
    """
    rows = _row_view(x, scheme)
    if rows is None or rows.shape[1] > blocks.BLOCK:
        return None
    qmin, qmax = code.qmin, code.qmax
    q = np.empty(x.shape, code.host_dtype)
    nrows = rows.shape[0]
    scales = np.empty(nrows, _F32)
    zps = None if symmetric and qmin < 0 else np.empty(nrows, np.int32)
    kernels = choice.kernels()
    plan = _FusedRows(rows, q.reshape(rows.shape), scales, zps, qmin, qmax, symmetric, eps, scale_dtype,
                      kernels, check)
    plan.pshape = scheme.param_shape
    if kernels is not None:
        fn = functools.partial(_dynamic_rows_compiled, plan=plan)
    else:
        # Finalized zero points lie in [qmin, qmax]: the loop for narrow zps serves every block.
        loop = block_loop(None, plan.ct, code)
        plan.zparams, fn = loop.zparams, loop.block
    run_blocks([plan], fn)
    pshape = scheme.param_shape
    return q, scales.reshape(pshape), None if zps is None else zps.reshape(pshape)


def _dynamic_rows_compiled(xb, qb, span, scratch, *, plan):
    """One block of rows through the compiled one-pass kernel."""
    r0, r1 = span
    x, table = kernel_input(xb.reshape(-1))  # bfloat16 as its bits, widened by a shift in the kernel
    it = KEY_INT[xb.dtype.itemsize]
    shift, mag, inf = key_constants(xb.dtype)
    zps = None if plan.zps is None else plan.zps[r0:r1]
    bad = plan.kernels.quantize_dynamic_rows(
        x, table, readonly(xb.reshape(-1).view(it)), xb.shape[1], qb.reshape(-1), plan.scales[r0:r1], zps,
        plan.qmin, plan.qmax, int(plan.symmetric), np.float32(plan.eps), SCALE_FORMATS[plan.scale_dtype],
        plan.ct.type(0), shift, mag, inf, plan.check)
    if bad >= 0:
        lo, hi = row_minmax(xb, plan.kernels)
        plan.raise_bad_rows(r0, r1, lo, hi)


def _row_view(x, scheme):
    """``x`` as (slots, row) when each parameter slot is one contiguous row, else None."""
    if x.size == 0 or not x.flags.c_contiguous or scheme.kind not in ("channel", "group"):
        return None
    shape = x.shape
    (k,) = scheme.axes
    if scheme.kind == "channel":
        if math.prod(shape[:k]) != 1:
            return None
        return x.reshape(shape[k], -1)
    g = scheme.group_size
    if k != x.ndim - 1 or shape[k] % g:
        return None
    return x.reshape(-1, g)


class _FusedRows:
    """Blocks of whole rows. With the compiled kernels (``kernels``) a block is just its rows
    (``_dynamic_rows_compiled`` does the rest); otherwise ``block`` reduces and finalizes, and
    hands the rows with their parameters to the ufunc quantize (``zparams``: finalized zps ->
    its zero-point params)."""

    def __init__(self, rows, q, scales, zps, qmin, qmax, symmetric, eps, scale_dtype, kernels, check):
        self.rows, self.q, self.scales, self.zps, self.check = rows, q, scales, zps, check
        self.qmin, self.qmax, self.symmetric, self.eps = qmin, qmax, symmetric, eps
        self.scale_dtype = scale_dtype
        self.kernels, self.zparams = kernels, None
        self.ct = compute_dtype(rows.dtype)
        self.size = rows.size
        self.per_block = max(1, FUSED_BLOCK // rows.shape[1])
        self.nblocks = -(-rows.shape[0] // self.per_block)

    def block(self, b, scratch):
        r0 = b * self.per_block
        r1 = min(r0 + self.per_block, self.rows.shape[0])
        xb = self.rows[r0:r1]
        if self.kernels is not None:
            return xb, self.q[r0:r1], (r0, r1)
        lo, hi = row_minmax(xb, None)
        try:
            s, z = finalize(lo, hi, self.qmin, self.qmax, self.symmetric, self.eps, self.scale_dtype,
                            strict=self.check, finite=self.check)
        except ValueError:
            self.raise_bad_rows(r0, r1, lo, hi)
        self.scales[r0:r1] = s
        if self.zps is not None:
            self.zps[r0:r1] = z
        params = [s.astype(self.ct)[:, None]] + [p[:, None] for p in self.zparams(z)]
        return xb, self.q[r0:r1], params

    def raise_bad_rows(self, r0, r1, lo, hi):
        """The ValueError of :func:`finalize` for rows ``r0:r1`` (min/max ``lo``/``hi``), saying
        where in the coordinates of the whole scales array (the other rows as all-zero ones)."""
        full_lo, full_hi = np.zeros(self.scales.shape, lo.dtype), np.zeros(self.scales.shape, hi.dtype)
        full_lo[r0:r1], full_hi[r0:r1] = lo, hi
        full_lo, full_hi = full_lo.reshape(self.pshape), full_hi.reshape(self.pshape)
        finalize(full_lo, full_hi, self.qmin, self.qmax, self.symmetric, self.eps, self.scale_dtype)
        raise AssertionError("gpuq internal error: a block failed in the loop but not in finalize")


def minmax(x, scheme):
    """Per-slot ``(lo, hi)`` of ``x``, in ``x.dtype`` and of ``scheme.param_shape``.

    NaN is ignored; a slot with no number (all NaN, or empty) gets NaN or
    ``(+inf, -inf)``, which :func:`finalize` treats as an all-zero block.
    """
    lo = np.full(scheme.param_shape, np.inf, x.dtype)
    hi = np.full(scheme.param_shape, -np.inf, x.dtype)
    if x.size == 0:
        return lo, hi
    plans = []
    for piece in scheme.pieces():
        # Splitting one dim in two (a group piece) is always a view, never a copy.
        xv = x[piece.src_index].reshape(piece.view_shape)
        # ``...`` keeps a 0-d parameter a view (``a[()]`` would be a scalar copy).
        pidx = piece.param_index or (Ellipsis,)
        lv = lo[pidx].reshape(piece.param_view_shape)
        hv = hi[pidx].reshape(piece.param_view_shape)
        plans.append(_ReducePlan(xv, lv, hv))
    run_blocks(plans, functools.partial(_reduce_unit, kernels=choice.kernels()))
    for plan in plans:
        plan.combine()
    return lo, hi


class _ReducePlan:
    """Units of one broadcast problem: ``x`` reduced into ``lo``/``hi`` (1 on reduced dims).

    Units split the largest kept dim where there are enough slots to share
    (disjoint outputs, no combining); otherwise (per-tensor, a few channels)
    they split the largest reduced dim and each unit writes its own partial
    slots, combined once at the end (a few times the parameter size).
    """

    def __init__(self, x, lo, hi):
        shape, x2, _, (lo2, hi2), kept = blocks.lower(x, x, [lo, hi])
        # lower() hands parameters back read-only; the same layout, writeable.
        as_strided = np.lib.stride_tricks.as_strided
        self.lo = as_strided(lo, lo2.shape, lo2.strides)
        self.hi = as_strided(hi, hi2.shape, hi2.strides)
        self.x, self.size = x2, x.size
        self.reduced = tuple(i for i in range(len(shape)) if i not in kept)
        self.partial = None
        threads = get_num_threads() if x.size >= 2 * UNIT else 1
        nslots = math.prod(shape[i] for i in kept)
        if not shape or threads == 1:
            self.axis, self.nunits = None, 1
        elif kept and (nslots >= 4 * threads or not self.reduced):
            self.axis = max(kept, key=lambda i: shape[i])
            self.nunits = min(shape[self.axis], 4 * threads)
        else:
            self.axis = max(self.reduced, key=lambda i: shape[i])
            self.nunits = min(shape[self.axis], 2 * threads)
            if self.nunits > 1:
                self.partial = (np.empty((self.nunits,) + lo2.shape, lo.dtype),
                                np.empty((self.nunits,) + hi2.shape, hi.dtype))
        self.nblocks = self.nunits

    def block(self, b, scratch):
        if self.axis is None:
            return self.x, (self.lo, self.hi), self.reduced
        n = self.x.shape[self.axis]
        a, e = n * b // self.nunits, n * (b + 1) // self.nunits
        cut = (slice(None),) * self.axis + (slice(a, e),)
        if self.partial is not None:
            return self.x[cut], (self.partial[0][b], self.partial[1][b]), self.reduced
        return self.x[cut], (self.lo[cut], self.hi[cut]), self.reduced

    def combine(self):
        if self.partial is not None:
            np.fmin.reduce(self.partial[0], axis=0, out=self.lo)
            np.fmax.reduce(self.partial[1], axis=0, out=self.hi)


def _reduce_unit(x, out, reduced, scratch, *, kernels):
    kept = x.ndim - len(reduced)
    if kernels is not None and reduced == tuple(range(kept, x.ndim)):
        # Slots of contiguous reduced elements: one compiled pass.
        found = _slot_minmax(x, kept, kernels)
        if found is not None:
            out[0][...] = found[0].reshape(out[0].shape)
            out[1][...] = found[1].reshape(out[1].shape)
            return
    _reduce_seq(x, out[0], out[1], reduced, False)


def _slot_minmax(x, kept, kernels):
    """NaN-ignoring min and max (flat, C order) of every slot of ``x``, its dims from ``kept`` on
    reduced, by the compiled kernels; None where the slots are not contiguous.

    A C-contiguous ``x`` is rows of slots (:func:`row_minmax`). Otherwise its trailing dims
    from some dim ``k <= kept`` may still be contiguous: rows of slots at a stride, e.g. the
    whole groups ``x[:, :14336]`` of a ragged ``(4160, 14400)`` tensor, reduced row by row
    (``loops.minmax_keys_rows``, ``blocks.reduction_rows``) instead of by NumPy on a strided
    view (3x the time, measured).
    """
    if x.flags.c_contiguous:
        return row_minmax(x.reshape(math.prod(x.shape[:kept]), -1), kernels)
    rows = blocks.reduction_rows(x, kept)
    if rows is None:
        return None
    span, layout = rows
    slots = math.prod(x.shape[:kept])
    it = KEY_INT[x.dtype.itemsize]
    shift, mag, inf = key_constants(x.dtype)
    kmin, kmax = np.empty(slots, it), np.empty(slots, it)
    kernels.minmax_keys_rows(layout, readonly(span.view(it)), math.prod(x.shape[kept:]), kmin, kmax, shift, mag, inf)
    return _floats_of_keys(kmin, kmax, x.dtype, shift, mag)


KEY_INT = {2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}


def key_constants(dtype):
    """``(shift, mag, inf)`` of the order keys of ``dtype``'s bits (``loops.minmax_keys``)."""
    it = KEY_INT[dtype.itemsize]
    info = np.iinfo(it)
    return it.type(info.bits - 1), it.type(info.max), np.array(np.inf, dtype).view(it)[()]


def row_minmax(rows, kernels):
    """NaN-ignoring min and max of every row of 2-D C-contiguous ``rows``, in its dtype.

    One pass of the compiled ``kernels`` (order keys, ``loops.minmax_keys``)
    where given, else :func:`nan_skipping_minmax`. A row with no number gets NaN either way.
    """
    if kernels is None or rows.size == 0:
        lo, hi = np.empty(rows.shape[0], rows.dtype), np.empty(rows.shape[0], rows.dtype)
        nan_skipping_minmax(rows, (1,), lo, hi, keepdims=False)
        return lo, hi
    it = KEY_INT[rows.dtype.itemsize]
    shift, mag, inf = key_constants(rows.dtype)
    kmin, kmax = np.empty(rows.shape[0], it), np.empty(rows.shape[0], it)
    kernels.minmax_keys(readonly(rows.reshape(-1).view(it)), rows.shape[1], kmin, kmax, shift, mag, inf)
    return _floats_of_keys(kmin, kmax, rows.dtype, shift, mag)


def _floats_of_keys(kmin, kmax, dtype, shift, mag):
    """The floats (``dtype``) of order keys: a key is its own inverse map, the same flip turns
    it back into the float's bits."""
    return (kmin ^ ((kmin >> shift) & mag)).view(dtype), (kmax ^ ((kmax >> shift) & mag)).view(dtype)


def nan_skipping_minmax(x, axes, lo, hi, keepdims=True):
    """The smallest and largest number of ``x`` over ``axes`` into ``lo``/``hi``, every NaN
    skipped, quiet or signalling (NaN only where there is no number).

    ``np.fmin``/``np.fmax`` skip a quiet NaN but not a signalling one (x86's minps/maxps
    return the second operand when either is a NaN, and NumPy's check sees only the first):
    after a signalling NaN the running value restarts, and part of the range is lost. So the
    NaN-propagating ``np.minimum`` goes first: where it finds no NaN its result stands and one
    ``np.maximum`` follows, as cheap as before; where it finds one, the reduction runs again
    on a copy with every NaN quieted (an exact multiplication by one), with fmin/fmax.

    >>> x = np.array([[3.0, -2.5, np.nan, -1.5]], np.float32)
    >>> x.view(np.uint32)[0, 2] = 0x7F810000            # a signalling NaN
    >>> lo, hi = np.empty((1, 1), np.float32), np.empty((1, 1), np.float32)
    >>> nan_skipping_minmax(x, (1,), lo, hi); float(lo[0, 0]), float(hi[0, 0])
    (-2.5, 3.0)
    """
    np.minimum.reduce(x, axis=axes, keepdims=keepdims, out=lo)
    if not np.isnan(lo).any():
        np.maximum.reduce(x, axis=axes, keepdims=keepdims, out=hi)
        return
    with np.errstate(invalid="ignore"):
        quiet = x * x.dtype.type(1)
    np.fmin.reduce(quiet, axis=axes, keepdims=keepdims, out=lo)
    np.fmax.reduce(quiet, axis=axes, keepdims=keepdims, out=hi)


def _reduce_seq(x, lo, hi, reduced, accumulate):
    """Reduce ``x`` into ``lo``/``hi`` on this thread, in cache-sized pieces."""
    if x.size <= UNIT:
        if accumulate:
            unit_lo, unit_hi = np.empty_like(lo), np.empty_like(hi)
            nan_skipping_minmax(x, reduced, unit_lo, unit_hi)
            np.fmin(lo, unit_lo, out=lo)
            np.fmax(hi, unit_hi, out=hi)
        else:
            nan_skipping_minmax(x, reduced, lo, hi)
        return
    inner = x[0].size
    dim0_reduced = 0 in reduced
    if inner > UNIT:
        # A row of dim 0 is bigger than a unit: walk the rows one at a time, one dim down.
        sub_reduced = tuple(i - 1 for i in reduced if i)
        for r in range(x.shape[0]):
            j = 0 if dim0_reduced else r
            _reduce_seq(x[r], lo[j], hi[j], sub_reduced, accumulate or (dim0_reduced and r > 0))
        return
    step = max(1, UNIT // inner)
    for a in range(0, x.shape[0], step):
        if dim0_reduced:
            _reduce_seq(x[a:a + step], lo, hi, reduced, accumulate or a > 0)
        else:
            _reduce_seq(x[a:a + step], lo[a:a + step], hi[a:a + step], reduced, accumulate)


#: The kernels' number of each ``scale_dtype`` (``loops.finalize_one``; kernels/qparams.cu's
#: ``round_scale`` numbers them the same way).
SCALE_FORMATS = {"float32": 0, "bfloat16": 1, "float16": 2}


@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def finalize(lo, hi, qmin, qmax, symmetric, eps, scale_dtype="float32", strict=True, finite=True):
    """Scales (float32) and zero points (int32, or None) from per-slot ``lo``/``hi``.

    ``lo``/``hi`` of any float dtype; float64 is rounded to float32 first
    (rounding is monotonic, so this is the min/max of the rounded values).
    Raises ``ValueError`` if a slot holds +/-inf or a value beyond float32 (``finite=False``:
    its scale is +inf instead, the formula's own result), or if a scale rounds to 0 or
    overflows in ``scale_dtype`` (:func:`round_scales`); with ``strict=False`` such a scale is
    returned as 0 or +inf instead: the MSE search leaves those candidates out. The asymmetric
    zero point of a scale 0 or +inf is 0 (``kernels/qparams.cu`` ``finalize_one``), the
    symmetric one stays.

    >>> finalize(np.float32([-1, -np.inf]), np.float32([np.inf, 2]), 0, 255, False, 2**-126,
    ...          strict=False, finite=False)
    (array([inf, inf], dtype=float32), array([0, 0], dtype=int32))
    """
    lo32, hi32 = lo.astype(_F32), hi.astype(_F32)
    if finite:
        _check_finite(lo32, hi32, lo, hi)
    eps = np.float32(eps)
    if symmetric:
        # Half the code range: 127 for 8-bit codes, 7 for 4-bit, max_finite for the float codes
        # (+-max: 448, 6, 7.5, ...); symmetric == 2 (scale_rule="full"): the whole range, 127.5 and 7.5.
        amax = np.fmax(np.fmax(hi32, -lo32), np.float32(0))
        if symmetric == 2:
            half = (qmax - qmin) / 2
        else:
            half = qmax if qmin == -qmax else (qmax - qmin) // 2
        scales = np.asarray(np.maximum(amax / np.float32(half), eps), _F32)
        scales = round_scales(scales, scale_dtype, strict)
        zps = None if qmin < 0 else np.full(scales.shape, (qmax + 1) // 2, np.int32)
        return scales, zps
    lo0 = np.fmin(lo32, np.float32(0))
    hi0 = np.fmax(hi32, np.float32(0))
    span = hi0 - lo0
    scales = span / np.float32(qmax - qmin)
    wide = np.isinf(span)
    if wide.any():
        # hi - lo overflows float32 (values near +/-FLT_MAX): the same quotient via float64.
        wide_s = (hi0.astype(_F64) - lo0.astype(_F64)) / float(qmax - qmin)
        scales = np.where(wide, wide_s.astype(_F32), scales)
    scales = round_scales(np.asarray(np.maximum(scales, eps), _F32), scale_dtype, strict)
    zps = np.float32(qmin) - np.rint(lo0 / scales)
    zps = np.clip(zps, qmin, qmax)
    if not strict or not finite:  # a scale 0 or +inf: zero point 0 (lo' / scale may be NaN)
        zps = np.where((scales == 0) | (scales == np.inf), np.float32(0), zps)
    return scales, np.asarray(zps, np.int32)


def round_scales(scales, scale_dtype, strict=True):
    """Positive finite float32 ``scales`` rounded to nearest even in ``scale_dtype``, as float32
    holding exactly the rounded values; ``ValueError`` where one rounds to 0 or overflows
    (``strict=False``: returned as 0 or +inf).

    bfloat16 by its bits (``(u + 0x7fff + lsb) >> 16``, no ml_dtypes needed: a scale is never
    NaN), float16 by NumPy's cast (nearest even, subnormals kept, +inf from 65520 on).

    >>> round_scales(np.float32([1 / 3, 70000.0]), "bfloat16").tolist()
    [0.333984375, 70144.0]
    >>> round_scales(np.float32([70000.0]), "float16")
    Traceback (most recent call last):
    ...
    ValueError: scale_dtype float16 cannot hold the scale 70000.0 chosen for the block of scales index (0,): it overflows float16 (largest 65504); use a wider scale_dtype
    """
    if scale_dtype == "float32":
        return scales
    if scale_dtype == "bfloat16":
        u = scales.view(np.uint32)
        rounded = (((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16) << 16).view(_F32)
    else:
        with np.errstate(over="ignore"):  # an overflow is an Inf here, reported below
            rounded = scales.astype(np.float16).astype(_F32)
    bad = (rounded == 0) | (rounded == np.inf)
    if strict and bad.any():
        i = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise ValueError(scale_range_message(scale_dtype, scales[i], rounded[i] == 0,
                                             f" chosen for the block of scales index "
                                             f"{tuple(int(j) for j in i)}" if bad.ndim else ""))
    return np.asarray(rounded, _F32)


#: Smallest positive and largest finite value of each rounded scale dtype, for the messages.
_SCALE_LIMITS = {"bfloat16": ("2**-133", "3.39e+38"), "float16": ("2**-24", "65504")}


def scale_range_message(scale_dtype, value, to_zero, where):
    """The ValueError text of a scale that ``scale_dtype`` cannot hold (it rounds to 0 or
    overflows). ``value`` is the float32 scale (None where it is not known: the GPU's flag)."""
    smallest, largest = _SCALE_LIMITS[scale_dtype]
    what = "" if value is None else f" {value}"
    if to_zero:
        why = (f"it rounds to 0 in {scale_dtype} (smallest {smallest}); pass a larger eps or use a "
               f"wider scale_dtype")
    else:
        why = f"it overflows {scale_dtype} (largest {largest}); use a wider scale_dtype"
    return f"scale_dtype {scale_dtype} cannot hold the scale{what}{where}: {why}"


def _check_finite(lo32, hi32, lo, hi):
    bad = (lo32 == -np.inf) | (hi32 == np.inf)
    if not bad.any():
        return
    i = np.unravel_index(int(np.argmax(bad)), bad.shape)
    raw = lo[i] if lo32[i] == -np.inf else hi[i]
    where = f" in the block of scales index {tuple(int(j) for j in i)}" if bad.ndim else ""
    what = f"{raw}" if np.isinf(raw) else f"{raw}, beyond the float32 range"
    raise ValueError(
        f"x must be finite (and within float32) to choose quantization parameters, got {what}{where}"
    )
