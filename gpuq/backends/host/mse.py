"""The MSE search for scales on the host (``choose_qparams(..., method="mse")``).

The rule is ``gpuq.qparams``' (module docstring): per block, 20 candidate ranges
``(p_i * lo, p_i * hi)``, ``p_i = float32((100 - i) / 100)``, each turned into a scale and zero
point by :func:`.qparams.finalize`; each candidate's error is the float64 sum of ``d * d`` over
the block's numbers in C order; the smallest error wins, the smaller ``i`` on a tie.

How it runs:

* :func:`.qparams.minmax` gives every block's min and max (and :func:`.qparams.finalize` the
  min/max parameters, raising for +/-Inf and unrepresentable scales exactly as ``"minmax"``).
* Each piece of the scheme (``Scheme.pieces``: a broadcast view) is transposed so that the
  dims its parameters follow come first and the block's own dims last, in their order; a
  block's elements in C order are then the C order of those last dims. Adjacent dims whose
  strides chain are merged, so the usual schemes (groups along the last axis, rows, a
  contiguous tensor) are one 2-D view.
* Tiles: where a block is at most :data:`UNIT` elements, a tile is a run of whole blocks,
  gathered into one contiguous ``(rows, block)`` array (a view where the layout already is);
  a longer block is cut into pieces of about :data:`UNIT` elements in its C order, and the
  pieces' sums chain (the running sum goes from one piece to the next), so the order is the
  contract's. Tiles are shared among the host threads; a long block with fewer blocks than
  threads splits its candidates among them instead.
* Per tile, the candidates' parameters come from :func:`.qparams.finalize` on the products
  (vectorised over the tile's blocks), and the errors from the compiled loops
  (:mod:`.mse_loops`) where they serve host arrays, else NumPy ufuncs with a sequential
  ``cumsum`` per row (never ``sum``: NumPy's reduction is pairwise, another order).

Memory: a few tiles of :data:`UNIT` elements per thread besides the parameters; nothing the
size of ``x``.
"""

from __future__ import annotations

import math

import numpy as np

from ..._dtypes import compute_dtype
from . import choice, formats, qparams
from .affine import kernel_input
from .threads import get_num_threads, run_blocks

#: Candidates per block, and their factors ``p_i = float32((100 - i) / 100)`` (``i = 0``:
#: min/max), computed as the contract states them: a float64 quotient rounded to float32.
CANDIDATES = 20
FACTORS = np.array([(100 - i) / 100 for i in range(CANDIDATES)], np.float64).astype(np.float32)
#: Elements per tile: the tile and each candidate's codes stay in L2 while its 20 passes run.
UNIT = 1 << 16

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def choose_qparams(x, scheme, code, symmetric, eps, scale_dtype):
    """Scales (float32) and zero points (int32, or None) of host ``x`` by the MSE search.

    >>> from gpuq._codetypes import CODE_TYPES
    >>> from gpuq._scheme import Scheme
    >>> x = np.float32([0.1, -0.2, 0.3, 0.05, -0.15, 0.25, 2.0])
    >>> choose_qparams(x, Scheme.build(x.shape), CODE_TYPES["int4"], True, 2.0**-126, "float32")[0]
    array(0.28, dtype=float32)
    """
    lo, hi = qparams.minmax(x, scheme)
    # Candidate 0's parameters: min/max's, with its checks and messages (+/-Inf, scale range).
    s0, z0 = qparams.finalize(lo, hi, code.qmin, code.qmax, symmetric, eps, scale_dtype)
    if x.size == 0:
        return s0, z0  # no numbers anywhere: every candidate's error is 0, candidate 0 wins
    search = _Search(x, scheme, code, symmetric, eps, scale_dtype,
                     lo.astype(_F32).reshape(-1), hi.astype(_F32).reshape(-1), z0 is not None)
    search.run()
    pshape = scheme.param_shape
    return search.scales.reshape(pshape), None if search.zps is None else search.zps.reshape(pshape)


class _Search:
    """One call's search: its tiles (work items), the candidates and the chosen parameters."""

    def __init__(self, x, scheme, code, symmetric, eps, scale_dtype, lo32, hi32, has_zps):
        self.code, self.symmetric, self.eps, self.scale_dtype = code, symmetric, eps, scale_dtype
        self.lo32, self.hi32 = lo32, hi32
        self.ct = compute_dtype(x.dtype)
        self.kernels = choice.kernels()
        n = lo32.size
        self.scales = np.empty(n, _F32)
        self.zps = np.empty(n, np.int32) if has_zps else None
        self.size = x.size
        self.items = []
        self.long = []  # (slot id, pieces in C order) of blocks longer than UNIT
        for xt, ids, nkept in _layouts(x, scheme):
            self._cut(xt, ids, nkept)
        self.long_errs = np.zeros((len(self.long), CANDIDATES), _F64)
        if self.long:
            threads = get_num_threads()
            parts = min(CANDIDATES, -(-threads // len(self.long))) if len(self.long) < threads else 1
            bounds = [CANDIDATES * i // parts for i in range(parts + 1)]
            self.items += [("long", k, bounds[i], bounds[i + 1])
                           for k in range(len(self.long)) for i in range(parts)]
        self.nblocks = len(self.items)

    # -- tiles ------------------------------------------------------------------------------------

    def _cut(self, xt, ids, nkept):
        """Work items of one piece: ``xt`` (kept dims, then the block's dims), ``ids`` (the slot
        of each kept position, kept shape)."""
        kshape, rshape = xt.shape[:nkept], xt.shape[nkept:]
        block = math.prod(rshape)
        if block <= UNIT:
            for index in _ranges(kshape, block):
                self.items.append(("rows", xt, ids, index, block))
            return
        for k in np.ndindex(*kshape):
            one = xt[k]
            self.long.append((int(ids[k]), [(one, index) for index in _ranges(rshape, 1)]))

    def block(self, b, scratch):
        return self.items[b], None, None

    def run(self):
        run_blocks([self], self._work)
        for k, (slot, _) in enumerate(self.long):
            ids = np.array([slot])
            s, z, valid = self._candidates(ids)
            self._choose(ids, s, z, valid, self.long_errs[k:k + 1])

    def _work(self, item, _out, _params, scratch):
        if item[0] == "rows":
            _, xt, ids, index, block = item
            tile = np.ascontiguousarray(xt[index]).reshape(-1, block)
            slots = ids[index].reshape(-1)
            s, z, valid = self._candidates(slots)
            errs = np.zeros((slots.size, CANDIDATES), _F64)
            self._errors(tile, s, z, errs, 0, CANDIDATES)
            self._choose(slots, s, z, valid, errs)
            return
        _, k, c0, c1 = item
        slot, pieces = self.long[k]
        s, z, _ = self._candidates(np.array([slot]))
        errs = self.long_errs[k:k + 1]  # this item's columns only: items of one block share the row
        for one, index in pieces:
            self._errors(np.ascontiguousarray(one[index]).reshape(1, -1), s, z, errs, c0, c1)

    # -- candidates, errors, choice -----------------------------------------------------------------

    def _candidates(self, slots):
        """``(scales, zps, valid)`` of every candidate of ``slots``, ``(n, CANDIDATES)``: the
        min/max rule on the float32 products; a scale that rounds to 0 in the scale dtype is not
        valid (min/max's own failures were raised before)."""
        with np.errstate(over="ignore", invalid="ignore"):  # a block of no number: +/-inf * p
            lo = self.lo32[slots][:, None] * FACTORS
            hi = self.hi32[slots][:, None] * FACTORS
        code = self.code
        s, z = qparams.finalize(lo, hi, code.qmin, code.qmax, self.symmetric, self.eps, self.scale_dtype,
                                strict=False)
        valid = (s != 0) & (s != np.inf)
        if z is None:
            z = np.zeros(s.shape, np.int32)
        return s, z, valid

    def _errors(self, tile, s, z, errs, c0, c1):
        """``errs[:, c0:c1] +=`` the squared errors of the rows of ``tile`` (C-contiguous 2-D)."""
        ct = self.ct
        sc = np.where(s != 0, s, np.float32(1)).astype(ct)  # a left-out candidate: any scale, unused
        if self.kernels is not None:
            x, table = kernel_input(tile.reshape(-1))
            if self.code.codec == "float8":
                self.kernels_mse().fp8_errors(x, table, tile.shape[1], sc, formats.fp8_table(self.code.fp8, ct),
                                              formats.fp8_consts(self.code.fp8, True), errs, c0, c1)
            else:
                self.kernels_mse().affine_errors(x, table, tile.shape[1], sc, z.astype(ct), self.code.qmin,
                                                 self.code.qmax, errs, c0, c1)
            return
        xc = tile.astype(ct)
        xd = tile.astype(_F64)
        nan = np.isnan(xc)
        for c in range(c0, c1):
            s_c = sc[:, c:c + 1]
            if self.code.codec == "float8":
                t = (xc / s_c).astype(_F32)  # float64 quotients rounded to float32 once, as quantize does
                bits = np.empty(t.shape, np.uint8)
                formats.fp8_bits(t, self.code.fp8, True, bits)
                y = formats.fp8_table(self.code.fp8, ct)[bits] * s_c
            else:
                z_c = z[:, c:c + 1].astype(ct)
                q = np.minimum(np.maximum(np.rint(xc / s_c) + z_c, ct.type(self.code.qmin)),
                               ct.type(self.code.qmax))
                y = (q - z_c) * s_c
            d = xd - y.astype(_F64)
            e = d * d
            e[nan] = 0.0  # adds +0: the running sum stays what it was, as a skipped element leaves it
            e[:, 0] += errs[:, c]
            # cumsum adds one element after the other (a reduction would pair them up).
            errs[:, c] = np.cumsum(e, axis=1)[:, -1]

    def kernels_mse(self):
        from . import mse_loops  # numba: only where the compiled loops serve host arrays

        return mse_loops

    def _choose(self, slots, s, z, valid, errs):
        """The chosen candidate of each slot: the smallest error, the smaller index on a tie
        (``argmin`` returns the first); left-out candidates never win (candidate 0 is valid)."""
        errs = np.where(valid, errs, np.inf)
        best = np.argmin(errs, axis=1)
        rows = np.arange(slots.size)
        self.scales[slots] = s[rows, best]
        if self.zps is not None:
            self.zps[slots] = z[rows, best]


def _ranges(shape, inner):
    """Index tuples that cut ``shape`` (each position holding ``inner`` elements) into tiles of
    about :data:`UNIT` elements, in C order: whole positions, a range along one dim.

    >>> list(_ranges((3, 4), 8192))                      # 32768 elements per row of 4: 2 rows a tile
    [(slice(0, 2, None),), (slice(2, 3, None),)]
    >>> list(_ranges((2, 4), 32768))[:3]                 # a row is too long: 2 positions of it a tile
    [(0, slice(0, 2, None)), (0, slice(2, 4, None)), (1, slice(0, 2, None))]
    >>> list(_ranges((), 10))
    [()]
    """
    if not shape:
        yield ()
        return
    level = 0
    while math.prod(shape[level + 1:]) * inner > UNIT and level < len(shape) - 1:
        level += 1
    per = math.prod(shape[level + 1:]) * inner
    step = max(1, UNIT // max(per, 1))
    for prefix in np.ndindex(*shape[:level]):
        for a in range(0, shape[level], step):
            yield prefix + (slice(a, min(a + step, shape[level])),)


def _layouts(x, scheme):
    """``(xt, ids, nkept)`` of each non-empty piece of ``scheme``: the piece with the dims its
    parameters follow first and the block's dims last (each group merged where the strides
    chain: a view), ``ids`` the flat slot of each kept position, ``nkept`` the kept dims."""
    all_ids = np.arange(math.prod(scheme.param_shape), dtype=np.int64).reshape(scheme.param_shape)
    for piece in scheme.pieces():
        xv = x[piece.src_index].reshape(piece.view_shape)
        if xv.size == 0:
            continue
        idv = all_ids[piece.param_index or (Ellipsis,)].reshape(piece.param_view_shape)
        kept = [d for d in range(xv.ndim) if idv.shape[d] != 1]
        red = [d for d in range(xv.ndim) if idv.shape[d] == 1]
        kshape, kstrides = _merge([xv.shape[d] for d in kept], [xv.strides[d] for d in kept])
        rshape, rstrides = _merge([xv.shape[d] for d in red], [xv.strides[d] for d in red])
        xt = np.lib.stride_tricks.as_strided(xv, kshape + rshape, kstrides + rstrides, writeable=False)
        ids = np.ascontiguousarray(idv.transpose(kept + red)).reshape(kshape)
        yield xt, ids, len(kshape)


def _merge(shape, strides):
    """Dims of size 1 dropped, neighbours whose strides chain merged (C order kept).

    >>> _merge([4, 1, 8, 2], [256, 64, 8, 4])            # 8 x 2 chain (8 == 4 * 2), 4 x 8 do not
    ((4, 16), (256, 4))
    """
    out = []
    for n, st in zip(shape, strides):
        if n == 1:
            continue
        if out and out[-1][1] == st * n:
            out[-1] = (out[-1][0] * n, st)
        else:
            out.append((n, st))
    return tuple(n for n, _ in out), tuple(st for _, st in out)
