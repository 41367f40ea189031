"""Every CUDA kernel instantiation launched at least once, bit for bit against the host backend.

The list of instantiations is :data:`gpuq.backends.cuda.registry.SOURCES`, so a
new one fails :func:`test_every_instantiation_has_a_sweep_case` until this file
knows how to reach it. Each case goes through the public API and gpuq's real
launch path (API -> dispatch -> CudaBackend -> compiler -> RawModule -> launch)
with odd sizes, inputs one element into their allocation, NaN/Inf/ties/
subnormals/saturation, and compares the bits with the same call on NumPy
arrays. On the CPU execution of the kernels (tests/cudasim) the launch record
proves that the case launched the kernel it is for, and the qparams kernels
run under every fiber schedule; on real CuPy the cases still compare bits.

The block reductions of qparams.cu are also run with the grid capped at two
blocks (``_MAX_BLOCKS``), so each block reduces several pieces one after the
other: that is where a missing ``__syncthreads`` before the shared memory is
reused shows (on a GPU only for tensors of more than 65536 pieces).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace

import numpy as np
import pytest

import gpuq
from conftest import CUDA_MODE, _cuda_skip_reason
from gpuq._codetypes import CODE_TYPES
from gpuq._dtypes import FLOAT_DTYPES

#: The one-byte integer codes of quantize.cu/dequantize.cu and their ranges.
QUANT_RANGE = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}
from gpuq.backends.cuda import mse as cuda_mse
from gpuq.backends.cuda import qparams as cuda_qparams
from gpuq.backends.cuda import registry

_REASON = _cuda_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
_SIM = CUDA_MODE == "sim"

_SPECIAL = [0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -2.5, 1e-45, -1e-45, 1.2e-38, np.nan, -np.nan, np.inf,
            -np.inf, 3e38, -3e38, 126.5, 127.5, -128.5, 254.5, 255.5, 1e6, -1e6]

#: (shape, axis, group_size) of the scheme that lowers to each index map.
_MAP_SCHEMES = {
    "tensor": ((1025,), None, None),   # one scale in device memory
    "value": ((1025,), None, None),    # one host scale and zero point, passed by value
    "channel": ((3, 17, 5), 1, None),
    "group": ((10, 5), 0, 3),          # ragged last group, elements after the axis
    "strided": ((3, 4, 5), (0, 2), None),
}


@dataclass(frozen=True)
class Case:
    """One public call that must launch ``name``."""

    op: str  # quantize | dequantize | choose_qparams | quantize_dynamic
    fdtype: np.dtype
    qdtype: np.dtype
    has_zp: bool = False
    map_name: str = ""
    warp: bool = False
    block_cap: bool = False  # cap the grid at two blocks (several pieces per block)
    shape: tuple = ()
    axis: object = None
    code: str = ""  # the code format of formats.cu ("int4", "float8_e4m3fn", ...); "" for int8/uint8
    block: tuple = None  # block_size= (the general block map and its reduction)
    method: str = "minmax"  # choose_qparams' method ("mse": kernels/mse.cu)
    group: int = None  # group_size= of choose_qparams / quantize_dynamic
    aligned: bool = False  # the device copy 16-byte aligned (else a view one element in)


def _cases() -> dict:
    """Name expression -> the case that launches it, built with the registry's own name builders."""
    cases = {}
    for f in FLOAT_DTYPES:
        for q in QUANT_RANGE:
            for zp in (False, True):
                for m in registry.MAPS:
                    cases[registry.quantize_name(f, q, zp, m)] = Case("quantize", f, q, zp, m)
                    cases[registry.dequantize_name(q, f, zp, m)] = Case("dequantize", f, q, zp, m)
        # per-tensor of <= 1024 elements: one warp; > 1024: a block; several pieces per block.
        cases[registry.segments_name(f, True)] = Case("choose_qparams", f, np.dtype(np.int8), shape=(17,))
        cases[registry.segments_name(f, False)] = Case("choose_qparams", f, np.dtype(np.uint8),
                                                       block_cap=True, shape=(3, 1100), axis=0)
        cases[registry.columns_name(f)] = Case("choose_qparams", f, np.dtype(np.uint8), shape=(7, 33), axis=1)
        # Ragged 3-D blocks (2-D ones take qparams_tiles), the grid capped: each thread block
        # reduces several blocks in turn.
        cases[registry.blocks_name(f)] = Case("choose_qparams", f, np.dtype(np.int8), block_cap=True,
                                              shape=(3, 37, 41), block=(2, 16, 16))
        # Ragged 2-D tiles, rows of every 16-byte alignment (41 columns), rows longer than a
        # warp's vectors (300 > 32 x 8 bfloat16), the grid capped: several tiles per thread block.
        cases[registry.tiles_name(f)] = Case("choose_qparams", f, np.dtype(np.int8), block_cap=True,
                                             shape=(37, 341), block=(16, 300))
        for q in QUANT_RANGE:
            cases[registry.fused_name(f, q, True)] = Case("quantize_dynamic", f, q, warp=True,
                                                          shape=(5, 33), axis=0)
            cases[registry.fused_name(f, q, False)] = Case("quantize_dynamic", f, q, block_cap=True,
                                                           shape=(5, 1100), axis=0)
    # The read-once dynamic kernel (aligned rows of whole units), one shape per schedule, each
    # just above the previous schedule's capacity; ragged groups for the 8-lane one; the grid
    # capped: each team takes several blocks in turn.
    shapes = {(8, 1): ((5, 160), 1, 128), (16, 1): ((5, 256), 0, None), (32, 1): ((3, 496), 0, None),
              (32, 2): ((3, 1024), 0, None), (256, 1): ((3, 1040), 0, None), (256, 2): ((2, 4112), 0, None),
              (256, 4): ((2, 8208), 0, None)}
    for f in FLOAT_DTYPES:
        if f.name not in registry.UNIT_FLOATS:
            continue
        for q in QUANT_RANGE:
            for sched, (shape, axis, group) in shapes.items():
                cases[registry.units_name(f, q, *sched)] = Case("quantize_dynamic", f, q, block_cap=True,
                                                                shape=shape, axis=axis, group=group, aligned=True)
    # The staged read-once kernel (blocks above 16384 elements in shared memory): odd rows of a
    # view one element in (every alignment of x and of the codes), the grid capped at two thread
    # blocks for three rows (a thread block stages a second row after the first).
    for f in FLOAT_DTYPES:
        if f.name in registry.UNIT_FLOATS:
            for q in QUANT_RANGE:
                cases[registry.staged_name(f, q)] = Case("quantize_dynamic", f, q, block_cap=True,
                                                         shape=(3, 16401), axis=0)
    # formats.cu: fp8 and packed int4, through the same public calls with dtype=<code>.
    i8 = np.dtype(np.int8)
    for f in FLOAT_DTYPES:
        for m in registry.MAPS:
            for code in registry.FP8_FMT:
                # saturate is a launch argument: the case runs both (one name).
                cases[registry.quantize_fp8_name(f, code, m)] = Case("quantize", f, i8, False, m, code=code)
                cases[registry.dequantize_fp8_name(code, f, m)] = Case("dequantize", f, i8, False, m, code=code)
            for code in ("int4", "uint4"):
                for zp in (False, True):
                    cases[registry.quantize_int4_name(f, code == "int4", zp, m)] = Case(
                        "quantize", f, i8, zp, m, code=code)
                    cases[registry.dequantize_int4_name(code == "int4", f, zp, m)] = Case(
                        "dequantize", f, i8, zp, m, code=code)
    # formats.cu's fp6 (a byte per code) and packed fp4: no zero points, always saturating.
    for f in FLOAT_DTYPES:
        for m in registry.MAPS:
            for code in registry.MINI_FMT:
                cases[registry.quantize_mini_name(f, code, m)] = Case("quantize", f, i8, False, m, code=code)
                cases[registry.dequantize_mini_name(code, f, m)] = Case("dequantize", f, i8, False, m, code=code)
    # mse.cu: the MSE search, ragged 2-D blocks of a 3-D tensor (the block walk's odometer), the
    # grid capped so that each warp searches several blocks in turn.
    for f in FLOAT_DTYPES:
        for codec in registry.MSE_CODECS:
            code = next((n for n in (*registry.FP8_FMT, *registry.MINI_FMT)
                         if registry.mse_codec(CODE_TYPES[n]) == codec), "") if codec else ""
            cases[registry.mse_name(f, codec)] = Case("choose_qparams", f, np.dtype(np.uint8), block_cap=True,
                                                      shape=(2, 9, 70), block=(1, 4, 32), code=code,
                                                      method="mse")
    cases.setdefault(registry.FINALIZE, Case("choose_qparams", np.dtype(np.float32), np.dtype(np.int8),
                                             shape=(4097,)))
    return cases


CASES = _cases()
# weight_pass.cu (the checkpoint's one-pass weight) has its own every-instantiation check against
# the host pass, through gpuq.checkpoints.fused_cuda: tests/test_fused_cuda.py.
ALL_NAMES = sorted(n for src, names in registry.SOURCES.items() if src != "weight_pass.cu" for n in names())
QPARAMS_NAMES = sorted(registry.SOURCES["qparams.cu"]() + registry.SOURCES["mse.cu"]())
SCHEDULES = ("inorder", "reversed", "interleaved")


def test_every_instantiation_has_a_sweep_case():
    assert len(ALL_NAMES) == len(set(ALL_NAMES))
    missing = [n for n in ALL_NAMES if n not in CASES]
    assert not missing, f"instantiations the sweep cannot reach yet: {missing}"


# ---------------------------------------------------------------------------------------------


@pytest.fixture
def cp():
    import cupy

    return cupy


def _data(shape, fdtype, seed):
    """Normal values times 40 with the special values first: NaN, +-Inf, ties, subnormals, saturation."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * 40
    k = min(n, len(_SPECIAL))
    x[:k] = _SPECIAL[:k]
    with np.errstate(over="ignore"):
        return x.astype(fdtype).reshape(shape)


def _offset_view(cp, host):
    """``host`` on the device as a view one element into its allocation (unaligned)."""
    flat = np.concatenate([np.zeros(1, host.dtype), host.ravel()])
    return cp.asarray(flat)[1:].reshape(host.shape)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


@contextlib.contextmanager
def _schedule(cp, name):
    if not _SIM:
        yield
        return
    with cp._sim.schedule(name):
        yield


def _launched(cp):
    return [r.name for r in cp._sim.launches] if _SIM else None


def _params(case, pshape, rng):
    s = rng.uniform(0.05, 3.0, pshape).astype(np.float32)
    s.reshape(-1)[:1] = 0.5  # exact ties on the first elements
    zlo, zhi = (-100, 100) if case.qdtype == np.int8 else (0, 255)
    z = rng.integers(zlo, zhi, pshape).astype(np.int32) if case.has_zp else None
    if z is not None and z.size > 1:
        z.reshape(-1)[-1] = 2**31 - 1  # the widest zero points: nothing may overflow
        z.reshape(-1)[-2] = -(2**31)
    return s, z


def _elementwise(cp, case, seed):
    shape, axis, group = _MAP_SCHEMES[case.map_name]
    rng = np.random.default_rng(seed)
    pshape = gpuq._scheme.Scheme.build(shape, axis, group).param_shape
    s, z = _params(case, pshape, rng)
    if case.map_name == "value":
        # One host value each (np.float32 scalar, Python int): the by-value launch.
        s_dev, z_dev = np.float32(s.reshape(-1)[0]), (None if z is None else int(z.reshape(-1)[0]))
        s, z = s_dev, z_dev
    else:
        s_dev, z_dev = cp.asarray(s), (None if z is None else cp.asarray(z))
    kw = dict(axis=axis, group_size=group)
    if case.code:
        return _formats(cp, case, shape, s, z, s_dev, z_dev, kw, rng, seed)
    if case.op == "quantize":
        x = _data(shape, case.fdtype, seed)
        host = gpuq.quantize(x, s, z, dtype=case.qdtype, **kw)
        dev = gpuq.quantize(_offset_view(cp, x), s_dev, z_dev, dtype=case.qdtype, **kw)
    else:
        lo, hi = QUANT_RANGE[case.qdtype]
        q = rng.integers(lo, hi + 1, shape).astype(case.qdtype)
        q.reshape(-1)[:2] = (lo, hi)
        host = gpuq.dequantize(q, s, z, dtype=case.fdtype, **kw)
        dev = gpuq.dequantize(_offset_view(cp, q), s_dev, z_dev, dtype=case.fdtype, **kw)
    return [(host, dev)]


def _code_bytes(result):
    """The stored bytes of a new-format result on the host: Codes' data, or an fp8 array's bits."""
    if isinstance(result, gpuq.Codes):
        data = result.data
        return data if isinstance(data, np.ndarray) else cp_asnumpy(data)
    return np.ascontiguousarray(result).view(np.uint8)


def cp_asnumpy(a):
    import cupy

    return cupy.asnumpy(a)


def _formats(cp, case, shape, s, z, s_dev, z_dev, kw, rng, seed):
    """fp8 / int4 / fp6 / fp4 cases: host and device calls with dtype=<code>, compared as stored bytes."""
    fp8 = case.code in registry.FP8_FMT
    fp6 = case.code in ("float6_e2m3fn", "float6_e3m2fn")
    if case.op == "quantize":
        x = _data(shape, case.fdtype, seed)
        x.reshape(-1)[-3:] = x.reshape(-1)[:3]  # the tail unit holds specials too
        zs = (None, None) if fp8 or case.code in registry.MINI_FMT else (z, z_dev)
        pairs = []
        for extra in ([dict(saturate=True), dict(saturate=False)] if fp8 else [{}]):
            host = gpuq.quantize(x, s, zs[0], dtype=case.code, **kw, **extra)
            dev = gpuq.quantize(_offset_view(cp, x), s_dev, zs[1], dtype=case.code, **kw, **extra)
            pairs.append((_code_bytes(host), _code_bytes(dev)))
        return pairs
    n = int(np.prod(shape))
    if fp8:
        import ml_dtypes

        bits = rng.integers(0, 256, n).astype(np.uint8)
        bits[:4] = (0x7F, 0xFF, 0x7C, 0x01)  # NaN of both signs, e5m2's Inf, a subnormal
        if n >= 260:
            bits[4:260] = np.arange(256)  # every code (the e4m3 decode differs by architecture)
        src_h = bits.reshape(shape).view(getattr(ml_dtypes, case.code))
        src_d = gpuq.Codes(_offset_view(cp, bits.reshape(shape)), shape, case.code)
        host = gpuq.dequantize(src_h, s, dtype=case.fdtype, **kw)
        dev = gpuq.dequantize(src_d, s_dev, dtype=case.fdtype, **kw)
    elif fp6:
        import ml_dtypes

        bits = rng.integers(0, 64, n).astype(np.uint8)
        bits[:3] = (0x1F, 0x3F, 0x20)  # the largest of both signs, -0
        src_h = bits.reshape(shape).view(getattr(ml_dtypes, case.code))
        src_d = gpuq.Codes(_offset_view(cp, bits.reshape(shape)), shape, case.code)
        host = gpuq.dequantize(src_h, s, dtype=case.fdtype, **kw)
        dev = gpuq.dequantize(src_d, s_dev, dtype=case.fdtype, **kw)
    else:  # packed int4 / uint4 (with zero points) and fp4 (none)
        if case.code in registry.MINI_FMT:
            z, z_dev = None, None
        packed = rng.integers(0, 256, (n + 1) // 2).astype(np.uint8)
        if n % 2:
            packed[-1] &= 0x0F  # the padding nibble is 0
        host = gpuq.dequantize(gpuq.Codes(packed, shape, case.code), s, z, dtype=case.fdtype, **kw)
        dev = gpuq.dequantize(gpuq.Codes(_offset_view(cp, packed), shape, case.code), s_dev, z_dev,
                              dtype=case.fdtype, **kw)
    return [(host, dev)]


def _qparams(cp, case, seed):
    x = _data(case.shape, case.fdtype, seed)
    with np.errstate(over="ignore"):
        x[~np.isfinite(x)] = 1.0  # choose_qparams refuses +/-Inf (tested elsewhere); NaN is skipped
        x.reshape(-1)[3] = np.nan
    # scale_dtype float16: data whose scales are float16 subnormals and normals (no overflow).
    small = (np.clip(x.astype(np.float64), -1e4, 1e4) * 1e-6).astype(x.dtype)
    pairs = []
    for symmetric in (True,) if case.code else (False, True):  # fp8 (a code): symmetric only
        for scale_dtype, data in (("float32", x), ("bfloat16", x), ("float16", small)):
            xd = cp.asarray(data) if case.aligned else _offset_view(cp, data)
            kw = dict(axis=case.axis, dtype=case.code or case.qdtype, symmetric=symmetric, block_size=case.block,
                      scale_dtype=scale_dtype, method=case.method, group_size=case.group)
            if case.op == "choose_qparams":
                h, d = gpuq.choose_qparams(data, **kw), gpuq.choose_qparams(xd, **kw)
            else:
                h, d = gpuq.quantize_dynamic(data, **kw), gpuq.quantize_dynamic(xd, **kw)
            pairs += [(a, b) for a, b in zip(h, d) if a is not None or b is not None]
    return pairs


def _run_case(cp, name, schedule, monkeypatch):
    case = CASES[name]
    if case.block_cap:
        monkeypatch.setattr(cuda_qparams, "_MAX_BLOCKS", 2)
        monkeypatch.setattr(cuda_mse, "_MAX_BLOCKS", 2)
    if _SIM:
        cp._sim.launches.clear()
    seed = ALL_NAMES.index(name)
    with _schedule(cp, schedule):
        if case.op in ("quantize", "dequantize"):
            pairs = _elementwise(cp, case, seed)
        else:
            pairs = _qparams(cp, case, seed)
    for host, dev in pairs:
        assert (host is None) == (dev is None)
        dev = cp.asnumpy(dev)
        assert host.dtype == dev.dtype and host.shape == dev.shape
        assert np.array_equal(_bits(host), _bits(dev)), (name, schedule)
    if _SIM:
        assert name in _launched(cp), f"{name} was not launched; launched: {sorted(set(_launched(cp)))}"


_ELEMENTWISE = [n for n in ALL_NAMES if n not in QPARAMS_NAMES]


# The sanitized sweep (test_sweep_under_ubsan) runs one representative float type per kernel
# family and code type, not every float type again: undefined behaviour lives in the code
# shared by a family (the traversal, the index maps, the code's conversion) and in its compute
# type (float or double: the conversions to integers). So each kernel template runs float64 for
# its first family and the float32-computed types in turn for the others (one template of one
# family: the types in turn over the templates). An elementwise representative is a whole
# compile unit (every index map, with and without zero points: one build), a qparams/MSE one a
# single kernel. The full sanitized sweep is the ``slow`` test test_full_sweep_under_ubsan
# (``pytest -m slow tests/test_cuda_sweep.py``).
def _ubsan_representatives() -> frozenset:
    by_template = {}
    for name in ALL_NAMES:
        case = CASES[name]
        elementwise = name in _ELEMENTWISE
        family = replace(case, fdtype=None, map_name="" if elementwise else case.map_name,
                         has_zp=False if elementwise else case.has_zp)
        families = by_template.setdefault(name.partition("<")[0], {})
        families.setdefault(repr(family), {}).setdefault(case.fdtype, []).append(name)
    f64 = np.dtype(np.float64)
    narrow = [f for f in FLOAT_DTYPES if f != f64]
    chosen = set()
    for t, template in enumerate(sorted(by_template)):
        for j, family in enumerate(sorted(by_template[template])):
            by_type = by_template[template][family]
            if len(by_template[template]) == 1:
                want = list(FLOAT_DTYPES)[t % len(FLOAT_DTYPES)]
            else:
                want = f64 if j == 0 else narrow[(t + j - 1) % len(narrow)]
            chosen.update(by_type.get(want) or next(iter(by_type.values())))
    return frozenset(chosen)


UBSAN_NAMES = _ubsan_representatives()
#: Marks the cases of the sanitized child's run (``-m ubsan``).
_UBSAN = pytest.mark.ubsan


def _cases_of(names, *schedules):
    """Parameters ``name`` (and ``schedule``), the sanitized run's representatives marked."""
    if not schedules:
        return [pytest.param(n, marks=_UBSAN if n in UBSAN_NAMES else ()) for n in names]
    return [pytest.param(n, s, id=f"{n}-{s}", marks=_UBSAN if n in UBSAN_NAMES and s == schedules[0] else ())
            for n in names for s in schedules]


@pytest.mark.parametrize("name", _cases_of(_ELEMENTWISE))
def test_elementwise_instantiation(cp, name, monkeypatch):
    _run_case(cp, name, "inorder", monkeypatch)


# The CPU execution builds for the device's compute capability (9.0 by default: sm_89+ paths run);
# the kernels whose text differs by architecture run again as sm_80 builds, so the paths kept for
# older GPUs are proven too. Only formats.cu branches on __CUDA_ARCH__ (mse.cu includes it;
# test_only_formats_cu_branches_on_the_architecture pins that), in three places: the saturating
# fp8 cast (quantize_fp8, per fp8 code; the float compute type for e4m3, double for e5m2: the
# cast takes the float32 quotient either way), and the e4m3 decode (dequantize_fp8 of e4m3, which
# is the decode mse.cu's e4m3 search calls too; e5m2's decode is one widening on every
# architecture). The encode of the MSE search is the software cast on every architecture.
_ARCH_DEPENDENT = ["gpuq::quantize_fp8<float, 0, float, 0>", "gpuq::quantize_fp8<double, 1, double, 0>",
                   "gpuq::dequantize_fp8<0, float, float, 0>"]


def test_only_formats_cu_branches_on_the_architecture():
    """The sm_80 reruns above cover every architecture branch of the kernels as built now: a new
    one (another source, another place) fails here until _ARCH_DEPENDENT covers it. The shim
    headers only define the default architecture."""
    from cudasim import hostbuild

    branches = {s: registry.source_text(s).count("__CUDA_ARCH__") for s in registry.SOURCES}
    # mse.cu and weight_pass.cu include formats.cu: its fp8 cast and e4m3 decode are the functions
    # the reruns above prove (weight_pass.cu's own cases: tests/test_fused_cuda.py)
    assert branches == {"quantize.cu": 0, "dequantize.cu": 0, "qparams.cu": 0, "formats.cu": 5, "mse.cu": 5,
                        "weight_pass.cu": 5}
    text = registry.source_text("formats.cu")
    guarded = [text[i:text.index("#endif", i)] for i in range(len(text)) if text.startswith("#if __CUDA_ARCH__", i)]
    assert [g.split("\n")[0] for g in guarded] == ["#if __CUDA_ARCH__ >= 890"] * len(guarded)
    assert all(n in ALL_NAMES for n in _ARCH_DEPENDENT)
    for header in hostbuild.SHIM_DIR.glob("*.h"):
        lines = [ln for ln in header.read_text().splitlines() if "__CUDA_ARCH__" in ln]
        assert len(lines) <= 2 and all(ln.startswith(("#ifndef __CUDA_ARCH__", "#define __CUDA_ARCH__ 800"))
                                       for ln in lines), (header.name, lines)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_UBSAN) for n in _ARCH_DEPENDENT])
def test_elementwise_instantiation_built_for_sm80(cp, name, monkeypatch):
    if not _SIM:
        pytest.skip("a real GPU builds for its own architecture")
    with cp._sim.compute_capability("80"):
        _run_case(cp, name, "inorder", monkeypatch)


@pytest.mark.parametrize("name, schedule", _cases_of(QPARAMS_NAMES, *SCHEDULES))
def test_qparams_instantiation_every_schedule(cp, name, schedule, monkeypatch):
    if not _SIM and schedule != "inorder":
        pytest.skip("fiber schedules exist only on the CPU execution of the kernels")
    _run_case(cp, name, schedule, monkeypatch)


def kernel_names_of(item):
    """The name expressions ``item`` launches (tests/_background.py prebuilds only their
    modules when every selected CUDA test says): a kernel case its own, any other none."""
    callspec = getattr(item, "callspec", None)
    name = callspec.params.get("name") if callspec is not None else None
    return {name} if name in CASES else set()


_SANITIZED_RUN = os.environ.get("GPUQ_SIM_SANITIZE") == "1"
_ubsan_child = None


def _start_ubsan_child(marks: str):
    """The sanitized sweep: this file again in a child pytest selecting ``-m marks`` (UBSan
    halts the process at the first report: a child keeps this session alive), output to files
    (no pipe to fill)."""
    import tempfile

    import _background

    env = dict(os.environ, GPUQ_SIM_SANITIZE="1", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", marks,
                             __file__], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    _background.on_exit(proc.kill)
    return proc, log


def start_background(items):
    """Started at collection (tests/_background.py): the child runs beside the suite."""
    global _ubsan_child
    if _SIM and not _SANITIZED_RUN and _REASON is None and any(
            item.name == "test_sweep_under_ubsan" for item in items):
        _ubsan_child = _start_ubsan_child("ubsan")


def _child_passed(proc, log, timeout: float) -> int:
    """The number of tests the child passed, once it ended cleanly with no UBSan report."""
    try:
        proc.wait(timeout=timeout)
    finally:
        proc.kill()
    log.seek(0)
    out = log.read()
    tail = out[-6000:].strip()
    assert proc.returncode == 0, tail
    assert "runtime error" not in out, tail
    passed = re.search(r"(\d+) passed", tail)
    assert passed, tail
    return int(passed.group(1))


_sanitizer_build = pytest.mark.skipif(
    not _SIM or _SANITIZED_RUN, reason="already the sanitized run" if _SANITIZED_RUN
    else "the sanitizer build exists only on the CPU execution of the kernels")


@_sanitizer_build
def test_sweep_under_ubsan():
    """The representative cases (``-m ubsan``: each kernel family and code type, the sm_80
    reruns) again, every kernel built with -fsanitize=undefined, in a child process (started
    at collection where this test is selected, else here)."""
    global _ubsan_child
    proc, log = _ubsan_child or _start_ubsan_child("ubsan")
    _ubsan_child = None
    expected = len(_ARCH_DEPENDENT) + len([n for n in ALL_NAMES if n in UBSAN_NAMES])
    assert _child_passed(proc, log, timeout=900) == expected


@pytest.mark.slow
@_sanitizer_build
def test_full_sweep_under_ubsan():
    """Every case of this file under UBSan, by hand: ``pytest -m slow tests/test_cuda_sweep.py``
    (its builds alone are ~74 sanitized g++ modules)."""
    proc, log = _start_ubsan_child("not slow")
    cases = len(_ELEMENTWISE) + len(_ARCH_DEPENDENT) + len(QPARAMS_NAMES) * len(SCHEDULES)
    assert _child_passed(proc, log, timeout=3600) > cases  # and the plain tests of this file
