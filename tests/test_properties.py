"""Property-based tests: the public API against the naive formula (tests/reference.py).

Hypothesis draws the cases: shapes with 0, 1 and odd sizes (now and then one
long dim, past the small-call and run-widening thresholds), every scheme
(per-tensor, ``axis=()``, per-channel with negative axes, multi-axis tuples in
any order, groups with a ragged last one), float16/32/64 inputs with NaN,
+/-Inf, ties, subnormals and values far out of range, int8/uint8 codes with no
zero point or with zero points from the code range to the int32 extremes,
scales as arrays of either precision, lists or Python floats, and src/out
as views: strided (steps of 2, negative), transposed, one element into their
allocation. Bulk values come from a NumPy generator seeded by Hypothesis, so a
failing case replays exactly.

Every check runs through the shared ``backend`` fixture (the arrays are built
on the host, moved with ``backend.put`` and cut into the same views there),
compares codes and zero points exactly and floats bit for bit, and checks that
src is not modified and that ``out`` outside its view is untouched. Budgets
and CI determinism: ``tests/_hypothesis.py``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import strategies as st

import gpuq
import reference as ref
from _hypothesis import run

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, U8 = np.dtype(np.int8), np.dtype(np.uint8)
QRANGE = {I8: (-128, 127), U8: (0, 255)}

#: Dims the shapes are made of: 0, 1, odd and even (Hypothesis favours the first ones);
#: LONG_DIMS for one dim of some shapes, past the small-call and run-widening thresholds.
DIMS = [1, 3, 2, 0, 5, 7, 4, 8, 13, 16, 31]
LONG_DIMS = [4099, 16411, 100, 1025, 40009]
MAX_SIZE = 70_000


# --- cases ---------------------------------------------------------------------------------------

@st.composite
def shapes(draw, max_size=MAX_SIZE):
    rank = draw(st.sampled_from([2, 3, 1, 4, 0]))
    if rank and draw(st.sampled_from([False, True, False])):  # one long dim, the others short
        dims = [draw(st.sampled_from([1, 3, 2, 5])) for _ in range(rank)]
        i = draw(st.integers(0, rank - 1))
        fits = [n for n in LONG_DIMS if n * math.prod(dims[:i] + dims[i + 1:]) <= max_size] or [100]
        dims[i] = draw(st.sampled_from(fits))
        return tuple(dims)
    return tuple(draw(st.sampled_from(DIMS)) for _ in range(rank))


@st.composite
def schemes(draw, shape):
    """``(axis, group_size)`` for ``shape``: None, (), an int (negative too), a tuple, a group."""
    r = len(shape)
    kinds = (["channel", "group", "axes"] if r else []) + ["tensor", "empty"]
    kind = draw(st.sampled_from(kinds))
    if kind == "tensor":
        return None, None
    if kind == "empty":
        return (), None
    k = draw(st.integers(-r, r - 1))
    if kind == "channel":
        return k, None
    if kind == "axes":
        axes = draw(st.permutations(range(r)))[:draw(st.integers(1, r))]
        return tuple(a - r if draw(st.booleans()) else a for a in axes), None
    n = shape[k]
    g = draw(st.sampled_from(sorted({1, 2, 3, 4, 5, 8, max(n - 1, 1), max(n, 1), n + 1})))
    return k, g


@st.composite
def layouts(draw, shape):
    """How a view of ``shape`` sits in its buffer (see :func:`place`)."""
    kind = draw(st.sampled_from(["c", "offset", "transpose", "strided"] if shape else ["c", "offset"]))
    if kind == "transpose":
        return ("transpose", tuple(draw(st.permutations(range(len(shape))))))
    if kind == "strided":
        return ("strided", tuple(draw(st.sampled_from([1, 2, -1, -2, 3])) for _ in shape))
    return (kind,)


@dataclass(frozen=True)
class Case:
    shape: tuple
    axis: object
    group_size: object
    fdtype: np.dtype
    qdtype: np.dtype
    scales: str  # how the scales are made: pow2 | any | special
    scale_form: str  # array | f32 | f64 | list | scalar
    zps: str  # none | code | narrow | wide | extreme
    zp_form: str  # int32 | int64 | small | list | scalar
    mix: tuple  # fractions of special values, ties, exact codes (the rest: normal)
    layout: tuple
    out_layout: tuple | None
    seed: int


@st.composite
def cases(draw, max_size=MAX_SIZE, with_out=True):
    shape = draw(shapes(max_size))
    axis, group_size = draw(schemes(shape))
    return Case(
        shape=shape, axis=axis, group_size=group_size,
        fdtype=draw(st.sampled_from([F32, F16, F64])),
        qdtype=draw(st.sampled_from([I8, U8])),
        scales=draw(st.sampled_from(["pow2", "any", "special"])),
        scale_form=draw(st.sampled_from(["array", "f32", "f64", "list", "scalar"])),
        zps=draw(st.sampled_from(["none", "code", "narrow", "wide", "extreme"])),
        zp_form=draw(st.sampled_from(["int32", "int64", "small", "list", "scalar"])),
        mix=tuple(draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])) for _ in range(3)),
        layout=draw(layouts(shape)),
        out_layout=draw(st.one_of(st.none(), layouts(shape))) if with_out else None,
        seed=draw(st.integers(0, 2**32 - 1)),
    )


# --- values --------------------------------------------------------------------------------------

def _compute(fdtype):
    return F64 if fdtype == F64 else F32


def make_scales(case, rng, ct):
    """Scales of the case's parameter shape: finite and > 0 in ``ct``, in the case's form."""
    pshape = ref.param_shape(case.shape, case.axis, case.group_size)
    n = math.prod(pshape)
    if case.scales == "pow2":
        s = 2.0 ** rng.integers(-12, 12, n)
    elif case.scales == "any":
        s = np.exp(rng.uniform(-14, 14, n))
    else:
        pool = [1.0, 0.1, 1 / 3, 2.0**-126, 2.0**-149, 3e38, 1e-3, 7.0]
        if ct == F64:
            pool += [1e-300, 1e300, 2.0**-1074, 0.1]
        s = rng.choice(pool, n)
    form = case.scale_form
    if form == "f32" or (ct == F32 and form != "f64"):
        with np.errstate(over="ignore"):
            s = s.astype(F32)
            s = np.where((s > 0) & np.isfinite(s), s, np.float32(1)).astype(F32)
    else:
        with np.errstate(over="ignore"):
            ok = (s.astype(ct) > 0) & np.isfinite(s.astype(ct))
        s = np.where(ok, s, 1.0)  # float64, valid once rounded to ct
    s = s.reshape(pshape)
    if form == "list" and 0 not in pshape:  # (a list of an empty dim has no trailing dims)
        return s.tolist()
    if form == "scalar" and pshape == ():
        return float(s)
    if form == "scalar" and case.axis in (None, ()):
        return s.reshape(1)  # the other one-element form of per-tensor
    return s


def make_zps(case, rng):
    if case.zps == "none":
        return None
    pshape = ref.param_shape(case.shape, case.axis, case.group_size)
    n = math.prod(pshape)
    qmin, qmax = QRANGE[case.qdtype]
    if case.zps == "code":
        z = rng.integers(qmin, qmax + 1, n)
    elif case.zps == "narrow":
        z = rng.integers(-300, 300, n)
    elif case.zps == "wide":  # around the float32 fast path's bound, 2**21
        z = rng.choice([2**21, 2**21 + 1, -(2**21), -(2**21) - 1, 2**22 + 3, -(2**23)], n)
    else:
        z = rng.choice([2**31 - 1, -(2**31), 2**31 - 128, -(2**31) + 127, 0, qmin, qmax], n)
    z = z.reshape(pshape)
    form = case.zp_form
    if form == "small" and case.qdtype == I8 and z.min(initial=0) >= -128 and z.max(initial=0) <= 127:
        return z.astype(np.int8)
    if form == "small" and z.min(initial=0) >= 0 and z.max(initial=0) <= 255:
        return z.astype(np.uint8)
    if form == "int64":
        return z.astype(np.int64)
    if form == "list" and 0 not in pshape:
        return z.tolist()
    if form == "scalar" and pshape == ():
        return int(z)
    return z.astype(np.int32)


def make_x(case, rng, scales):
    """Float values of the case's shape: normal ones, specials, ties and exact codes (per element,
    the ties and codes are multiples of that element's own scale)."""
    ct = _compute(case.fdtype)
    shape = case.shape
    s = np.asarray(ref.expand(np.asarray(scales, ct), shape, case.axis, case.group_size), np.float64)
    info = np.finfo(case.fdtype)
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, float(info.smallest_subnormal),
                         -float(info.smallest_subnormal), float(info.tiny), float(info.max), -float(info.max),
                         0.5, 1.5, 2.5, -0.5, -2.5, 127.5, -128.5, 255.5, 1e6, -1e6])
    special, tie, code = case.mix
    x = rng.normal(0, 100, shape) * s
    pick = rng.random(shape)
    ints = rng.integers(-300, 300, shape).astype(np.float64)
    x = np.where(pick < code, ints * s, x)
    x = np.where(pick < tie, (ints + 0.5) * s, x)
    x = np.where(pick < special, rng.choice(specials, shape), x)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, np.float64).astype(case.fdtype)


def make_codes(case, rng):
    qmin, qmax = QRANGE[case.qdtype]
    edges = np.array([qmin, qmin + 1, 0 if qmin < 0 else 128, qmax - 1, qmax])
    q = rng.integers(qmin, qmax + 1, case.shape)
    q = np.where(rng.random(case.shape) < case.mix[0], rng.choice(edges, case.shape), q)
    return q.astype(case.qdtype)


# --- views ---------------------------------------------------------------------------------------

def _strided_slices(shape, steps):
    return tuple(slice(0, n * s, s) if s > 0 else slice(n * -s - 1, None, s) for n, s in zip(shape, steps))


def fill(values, layout, filler):
    """A host buffer in which ``cut(buffer, layout)`` holds ``values``; elsewhere ``filler``."""
    kind = layout[0]
    if kind == "c":
        return values.copy()
    if kind == "offset":
        buf = np.full(values.size + 2, filler, values.dtype)
        buf[1:1 + values.size] = values.reshape(-1)
        return buf
    if kind == "transpose":
        return np.ascontiguousarray(values.transpose(layout[1]))
    buf = np.full(tuple(n * abs(s) for n, s in zip(values.shape, layout[1])), filler, values.dtype)
    buf[_strided_slices(values.shape, layout[1])] = values
    return buf


def cut(buf, layout, shape):
    """The view of ``shape`` in ``buf`` (NumPy or device array: slicing, transposes, reshapes)."""
    kind = layout[0]
    if kind == "c":
        return buf
    if kind == "offset":
        return buf[1:1 + math.prod(shape)].reshape(shape)
    if kind == "transpose":
        return buf.transpose(tuple(np.argsort(layout[1])))
    return buf[_strided_slices(shape, layout[1])]


def place(backend, values, layout, filler=0):
    """``(buffer, view)`` on the backend, the view holding ``values``."""
    buf = backend.put(fill(values, layout, filler))
    return buf, cut(buf, layout, values.shape)


def bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.itemsize}") if a.dtype.kind == "f" else a


def same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(bits(got), bits(want))


# --- properties ----------------------------------------------------------------------------------

def check_quantize(backend, case):
    rng = np.random.default_rng(case.seed)
    ct = _compute(case.fdtype)
    scales, zps = make_scales(case, rng, ct), make_zps(case, rng)
    x = make_x(case, rng, scales)
    buf, src = place(backend, x, case.layout)
    before = backend.get(buf).copy()
    kw = dict(axis=case.axis, group_size=case.group_size)
    want = ref.quantize(x, scales, zps, dtype=case.qdtype, **kw)
    if case.out_layout is None:
        got = gpuq.quantize(src, scales, zps, dtype=case.qdtype, **kw)
    else:
        filler = 77
        obuf, out = place(backend, np.full(case.shape, filler, case.qdtype), case.out_layout, filler)
        got = gpuq.quantize(src, scales, zps, out=out, **kw)  # dtype from out
        assert got is out
        rest = backend.get(obuf).copy()
        np.asarray(cut(rest, case.out_layout, case.shape))[...] = filler
        assert (rest == filler).all(), "quantize wrote outside out"
    same_bits(backend.get(got), want)
    same_bits(backend.get(buf), before)


def check_dequantize(backend, case):
    rng = np.random.default_rng(case.seed)
    odtype = case.fdtype
    scales, zps = make_scales(case, rng, _compute(odtype)), make_zps(case, rng)
    q = make_codes(case, rng)
    buf, src = place(backend, q, case.layout)
    before = backend.get(buf).copy()
    kw = dict(axis=case.axis, group_size=case.group_size)
    want = ref.dequantize(q, scales, zps, dtype=odtype, **kw)
    if case.out_layout is None:
        got = gpuq.dequantize(src, scales, zps, dtype=odtype, **kw)
    else:
        filler = -7.25
        obuf, out = place(backend, np.full(case.shape, filler, odtype), case.out_layout, filler)
        got = gpuq.dequantize(src, scales, zps, out=out, **kw)  # dtype from out
        assert got is out
        rest = backend.get(obuf).copy()
        np.asarray(cut(rest, case.out_layout, case.shape))[...] = filler
        assert (rest == filler).all(), "dequantize wrote outside out"
    same_bits(backend.get(got), want)
    same_bits(backend.get(buf), before)


@st.composite
def qparams_cases(draw):
    case = draw(cases(max_size=20_000, with_out=False))
    return case, draw(st.booleans()), draw(st.sampled_from([0.0, 0.0, 0.01]))


def check_qparams(backend, drawn):
    """choose_qparams and quantize_dynamic against the documented formula (reference.choose_qparams)."""
    case, symmetric, inf_share = drawn
    rng = np.random.default_rng(case.seed)
    x = make_x(case, rng, make_scales(case, rng, _compute(case.fdtype)))
    x = np.where(np.isinf(x) & (rng.random(x.shape) >= inf_share), 0, x).astype(case.fdtype)
    buf, src = place(backend, x, case.layout)
    before = backend.get(buf).copy()
    kw = dict(axis=case.axis, group_size=case.group_size, dtype=case.qdtype, symmetric=symmetric)
    try:
        want_s, want_z = ref.choose_qparams(x, **kw)
    except ValueError:  # an infinite block (or a float64 value beyond float32)
        with pytest.raises(ValueError, match=r"x must be finite \(and within float32\)"):
            gpuq.choose_qparams(src, **kw)
        with pytest.raises(ValueError, match=r"x must be finite \(and within float32\)"):
            gpuq.quantize_dynamic(src, **kw)
        return
    s, z = gpuq.choose_qparams(src, **kw)
    same_bits(backend.get(s), want_s)
    assert (z is None) == (want_z is None)
    if want_z is not None:
        same_bits(backend.get(z), want_z)
    q, s2, z2 = gpuq.quantize_dynamic(src, **kw)
    same_bits(backend.get(s2), want_s)
    assert (z2 is None) == (want_z is None)
    if want_z is not None:
        same_bits(backend.get(z2), want_z)
    same_bits(backend.get(q), ref.quantize(x, want_s, want_z, axis=case.axis, group_size=case.group_size,
                                           dtype=case.qdtype))
    same_bits(backend.get(buf), before)


@st.composite
def op_cases(draw):
    case = draw(cases(max_size=5_000, with_out=False))
    qtype = "per_tensor" if case.axis is None or not case.shape else "per_channel"
    axis = draw(st.integers(-len(case.shape), len(case.shape) - 1)) if qtype == "per_channel" else 1
    return case, qtype, axis


def check_ops(backend, drawn):
    """The static op objects give the functional API's bits (one scale rule) and the reference's."""
    case, qtype, axis = drawn
    rng = np.random.default_rng(case.seed)
    n = 1 if qtype == "per_tensor" else case.shape[axis]
    fn_axis = None if qtype == "per_tensor" else axis
    pool = [0.1, 1 / 3, 0.25, 2.0**-20, 1e-3, 3.3]
    scales = rng.choice(pool, n).tolist()  # Python floats: float64, rounded to float32 where it computes so
    zps = None if case.zps == "none" else rng.integers(-300, 300, n).tolist()
    ref_kw = dict(axis=fn_axis)
    if qtype == "per_tensor":
        ref_s, ref_z = scales[0], None if zps is None else zps[0]
    else:
        ref_s, ref_z = scales, zps
    x = make_x(replace(case, axis=fn_axis, group_size=None), rng, np.asarray(ref_s, np.float64))
    _, src = place(backend, x, case.layout)
    q = gpuq.Quantize(scales, zps, qtype=qtype, axis=axis, dtype=case.qdtype)(src)
    want_q = ref.quantize(x, ref_s, ref_z, dtype=case.qdtype, **ref_kw)
    same_bits(backend.get(q), want_q)
    y = gpuq.Dequantize(scales, zps, qtype=qtype, axis=axis, dtype=case.fdtype)(q)
    same_bits(backend.get(y), ref.dequantize(want_q, ref_s, ref_z, dtype=case.fdtype, **ref_kw))
    same_bits(backend.get(y), backend.get(gpuq.dequantize(q, ref_s, ref_z, dtype=case.fdtype, **ref_kw)))


def test_quantize_matches_reference(backend):
    run(check_quantize, cases(), 300, backend)


def test_dequantize_matches_reference(backend):
    run(check_dequantize, cases(), 250, backend)


def test_choose_qparams_and_quantize_dynamic_match_reference(backend):
    run(check_qparams, qparams_cases(), 150, backend)


def test_op_objects_match_reference(backend):
    run(check_ops, op_cases(), 100, backend)


# --- the error policy under fuzzing --------------------------------------------------------------
#
# Each argument is good most of the time and, one time in four, drawn from a pool of bad
# ones, so most calls get deep into validation with one or two bad arguments among good ones.

def _quiet(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # np.matrix says it is discouraged
        return make()


def _read_only(a):
    a.flags.writeable = False
    return a


_FLOAT_SRC = [
    np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3), np.linspace(-3, 3, 6).reshape(2, 3),
    np.ones((2, 3), np.float16), np.zeros((0, 3), np.float32), np.array(1.5, np.float32), np.float32(2.5),
    np.ones((2, 3), ">f4"), np.ones((2, 3), ">f8"), np.ones((4, 6), np.float32)[::2, ::-2],
    _quiet(lambda: np.matrix([[1.0, -2.0, 3.0], [0.5, 0.25, 7.0]], np.float32)),
    np.ones((3, 2), np.float32).T, np.arange(6.0).reshape(2, 3).view(type("Tagged", (np.ndarray,), {})),
]
_CODE_SRC = [np.arange(6, dtype=np.int8).reshape(2, 3), np.arange(6, dtype=np.uint8).reshape(2, 3),
             np.zeros((0, 3), np.int8), np.array(5, np.int8), np.int8(3),
             np.arange(12, dtype=np.int8)[1::2].reshape(2, 3), _quiet(lambda: np.matrix([[1, 2, 3], [4, 5, 6]], np.int8))]
_BAD_SRC = [np.zeros((2, 3), np.int32), np.zeros((2, 3), bool), np.zeros((2, 3), np.complex64),
            np.array([["a", "b", "c"]] * 2), np.empty((2, 3), object), [1.0, 2.0], 3.0, None, "x",
            np.ma.array(np.ones((2, 3), np.float32), mask=np.eye(2, 3)), np.zeros((2, 3), np.float32),
            np.zeros((2, 3), np.int8), np.zeros((2, 3), "datetime64[s]")]
_BAD_SCALES = [None, True, "1.0", [], [[]], [1.0, [2.0]], object(), 1 + 1j, np.array([1 + 1j]), 0.0, -1.0,
               1e39, 1e-50, np.nan, np.inf, -np.inf, 10**30, np.ones(3, np.int32), np.datetime64("2020-01-01"),
               {1: 2}, np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0]), np.ones(7, np.float32), [0.5] * 4,
               np.array([0.5, 0.0, 0.5]), np.array([0.5, np.nan, 0.5], np.float64)]
_BAD_ZPS = [1.5, True, "3", 2**31, -(2**31) - 1, np.ones(3, np.uint64) * 2**40, np.array([2**40] * 3),
            [[1, 2, 3]], 10**30, object(), np.ma.array([1, 2, 3]), np.zeros(3, np.float32), [1, 2],
            np.zeros(7, np.int32), [1.0, 2.0, 3.0]]
_BAD_AXIS = [2, 5, -3, -9, 1.0, True, "0", (0, 0), (1, -1), [1], (0, None), object(), np.float64(1)]
_BAD_GROUP = [0, -1, 2.5, True, "2", np.float32(2)]
#: Good dtype arguments and the dtype each names.
_QDTYPES = {"int8": np.int8, "u8": np.uint8, "s8": np.int8, np.uint8: np.uint8, "uint8": np.uint8}
_FDTYPES = {"float32": np.float32, "f16": np.float16, "f64": np.float64, np.float64: np.float64,
            "float16": np.float16}
_BAD_DTYPES = ["s32", "float32", ">f4", np.int16, int, float, "nope", 3, object(), np.dtype("V3"), "bf16",
               "int8", "u8", "f4", "", "s4", "uint4", "float8_e4m3fn", "f8_e5m2"]
_BAD_QTYPES = ["per_row", None, "PER_TENSOR", 1, "per_group"]


@st.composite
def _schemes_for(draw, shape):
    """A good (axis, group_size) for ``shape`` (None/() for 0-d)."""
    if not shape:
        return draw(st.sampled_from([None, ()])), None
    return draw(schemes(shape))


@st.composite
def fuzz_calls(draw):
    """``(function name, kwargs)`` of one public call."""
    fn = draw(st.sampled_from(["quantize", "dequantize", "choose_qparams", "quantize_dynamic",
                               "Quantize", "Dequantize", "DynamicQuantize", "DynamicDequantize"]))
    quant = fn in ("quantize", "choose_qparams", "quantize_dynamic", "Quantize", "DynamicQuantize")

    def bad():
        return draw(st.integers(0, 3)) == 0

    src = draw(st.sampled_from(_BAD_SRC if bad() else _FLOAT_SRC if quant else _CODE_SRC))
    shape = tuple(np.shape(src)) if isinstance(src, (np.ndarray, np.generic)) else (2, 3)
    if bad():
        axis, group = draw(st.sampled_from([None, 1] + _BAD_AXIS)), draw(st.sampled_from([None, 2] + _BAD_GROUP))
        pshape = (3,)
    else:
        axis, group = draw(_schemes_for(shape))
        pshape = ref.param_shape(shape, axis, group)
    if bad():
        scales = draw(st.sampled_from(_BAD_SCALES))
    else:
        form = draw(st.sampled_from(["f32", "f64", "list", ">f4", "scalar"]))
        s = np.full(pshape, 0.5)
        scales = (s.astype(np.float32) if form == "f32" else s.astype(">f4") if form == ">f4"
                  else s.tolist() if form == "list" and 0 not in pshape
                  else 0.5 if form == "scalar" and pshape == () else s)
    if bad():
        zps = draw(st.sampled_from(_BAD_ZPS))
    else:
        zps = draw(st.sampled_from([None, np.int32, np.int8, ">i4", list]))
        if zps is not None:
            z = np.full(pshape, 3, np.int32)
            zps = z.tolist() if zps is list and 0 not in pshape else z.astype(zps if zps is not list else np.int32)
    good = _QDTYPES if quant else _FDTYPES
    dtype = draw(st.sampled_from(_BAD_DTYPES if bad() else [None] + list(good)))
    odtype = np.dtype(good.get(dtype, np.int8 if quant else np.float32) if isinstance(dtype, (str, type)) else
                      (np.int8 if quant else np.float32))
    if bad():
        out = draw(st.sampled_from(["list", "shape", "dtype", "read-only", "masked", "overlap"]))
    else:
        out = draw(st.sampled_from([None, None, "plain", "strided", "swapped", "matrix"]))
    kw = dict(src=src, axis=axis, group_size=group, scales=scales, zps=zps, dtype=dtype, out=out,
              odtype=odtype, symmetric=draw(st.sampled_from([False, True, np.True_] + ([1, None] if bad() else []))),
              eps=draw(st.sampled_from([None, 1e-6] + ([0.0, -1.0, "x", np.inf, 1e-50, True] if bad() else []))),
              qtype=draw(st.sampled_from(_BAD_QTYPES)) if bad() else None)
    return fn, kw


def _make_out(kind, src, odtype):
    """A fresh ``out`` of the given kind for ``src`` (None for none)."""
    shape = tuple(np.shape(src)) if isinstance(src, (np.ndarray, np.generic)) else (2, 3)
    if kind is None:
        return None
    if kind == "list":
        return [0] * 6
    if kind == "shape":
        return np.zeros((7,), odtype)
    if kind == "dtype":
        return np.zeros(shape, np.int16)
    if kind == "read-only":
        return _read_only(np.zeros(shape, odtype))
    if kind == "masked":
        return np.ma.zeros(shape, odtype)
    if kind == "overlap":
        return src if isinstance(src, np.ndarray) else np.zeros(shape, odtype)
    if kind == "strided":
        return np.zeros(tuple(2 * n for n in shape), odtype)[tuple(slice(None, None, 2) for _ in shape)]
    if kind == "swapped":
        return np.zeros(shape, odtype.newbyteorder(">") if odtype.itemsize > 1 else odtype)
    if kind == "matrix" and len(shape) == 2:
        return _quiet(lambda: np.asmatrix(np.zeros(shape, odtype)))
    return np.zeros(shape, odtype)


def _op_args(kw, shape):
    """qtype/axis/group_shape for the op objects from the drawn scheme (or the drawn bad qtype)."""
    axis, group = kw["axis"], kw["group_size"]
    if kw["qtype"] is not None:
        return dict(qtype=kw["qtype"], axis=1)
    if group is not None and isinstance(axis, int) and not isinstance(axis, bool) and -len(shape) <= axis < len(shape):
        gshape = [1] * len(shape)
        gshape[axis] = group
        return dict(qtype="per_group", group_shape=gshape)
    if axis is None or (isinstance(axis, tuple) and not axis):
        return dict(qtype="per_tensor")
    return dict(qtype="per_channel", axis=axis if not isinstance(axis, tuple) else axis[0])


def _fuzz_call(fn, kw):
    """``(call, out)``: a thunk for one public call and the ``out`` it may write."""
    src, scales, zps = kw["src"], kw["scales"], kw["zps"]
    out = _make_out(kw["out"], src, kw["odtype"]) if fn not in ("choose_qparams", "quantize_dynamic") else None
    d = {} if kw["dtype"] is None else {"dtype": kw["dtype"]}
    scheme = dict(axis=kw["axis"], group_size=kw["group_size"])
    if fn in ("quantize", "dequantize"):
        f = getattr(gpuq, fn)
        return (lambda: f(src, scales, zps, out=out, **scheme, **d)), out
    if fn == "choose_qparams":
        return (lambda: gpuq.choose_qparams(src, symmetric=kw["symmetric"], eps=kw["eps"], **scheme, **d)), None
    if fn == "quantize_dynamic":
        return (lambda: gpuq.quantize_dynamic(src, symmetric=kw["symmetric"], **scheme, **d)), None
    shape = tuple(np.shape(src)) if isinstance(src, (np.ndarray, np.generic)) else (2, 3)
    op = _op_args(kw, shape)
    cls = getattr(gpuq, fn)
    if fn in ("Quantize", "Dequantize"):
        op.pop("group_shape", None)
        s1 = (np.ravel(scales).tolist() if isinstance(scales, np.ndarray) and scales.dtype.kind == "f"
              else [scales] if isinstance(scales, float) else scales)  # the ops take lists
        z1 = np.ravel(zps).tolist() if isinstance(zps, np.ndarray) and zps.dtype.kind in "iu" else zps
        return (lambda: cls(s1, z1, **op, **d)(src, out=out)), out
    return (lambda: cls(**op, **d)(src, scales, zps, out=out)), out


def check_fuzz(drawn):
    """Any mix of good and bad arguments: a result, or TypeError/ValueError (exactly those) with
    ``out`` unwritten; never another exception (numba's TypingError, a NumPy internal error) and
    never a warning."""
    fn, kw = drawn
    call, out = _fuzz_call(fn, kw)
    before = np.array(out, copy=True) if isinstance(out, np.ndarray) else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            result = call()
        except (TypeError, ValueError) as exc:
            assert type(exc) in (TypeError, ValueError), f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
            if before is not None:
                np.testing.assert_array_equal(np.asarray(out), before, err_msg="out written before a raise")
            return
    if fn == "choose_qparams":
        scales, zps = result
        assert type(scales) is np.ndarray and scales.dtype == np.float32
        assert zps is None or (type(zps) is np.ndarray and zps.dtype == np.int32)
        return
    first = result[0] if fn == "quantize_dynamic" else result
    if out is not None:
        assert result is out
    elif isinstance(first, gpuq.Codes):  # int4/uint4 codes: packed bytes with their shape
        assert first.dtype in ("int4", "uint4") and type(first.data) is np.ndarray
        assert first.shape == np.shape(kw["src"])
        return
    else:
        assert type(first) is np.ndarray, type(first)
    assert np.shape(first) == np.shape(kw["src"])
    dt = np.asarray(first).dtype
    if fn in ("quantize", "quantize_dynamic", "Quantize", "DynamicQuantize"):
        assert dt in (np.int8, np.uint8) or dt.name in ("float8_e4m3fn", "float8_e5m2"), dt
    else:
        assert dt.kind == "f" or dt.name == "bfloat16", dt


def test_bad_arguments_raise_only_documented_errors(host_loops):
    """The error policy (DESIGN.md section 4) under fuzzing, on both host loops."""
    run(check_fuzz, fuzz_calls(), 600)
