"""The CUDA backend's own behaviour: dispatch, placement, streams, uploads, layouts.

The bit-exactness bodies shared with the NumPy backend live in the core test
files (``backend`` fixture). Tests here run on real CuPy with a GPU and, without
one, on the CPU execution of the kernels (tests/cudasim); the few marked
``real_cupy`` need what only real CuPy and hardware have. The first few check
what needs no CUDA at all (no CuPy import, alignment arithmetic).
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import gpuq
from conftest import _cuda_skip_reason
from gpuq.backends.cuda import launch as cuda_backend


_REASON = _cuda_skip_reason()
needs_gpu = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


# ---------------------------------------------------------------------------
# Any machine


def test_import_gpuq_and_backend_never_import_cupy():
    code = ("import sys, gpuq, gpuq.backends.cuda.backend, gpuq.backends.cuda.nvrtc_check; "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _fake(ptr, itemsize):
    return SimpleNamespace(data=SimpleNamespace(ptr=ptr), itemsize=itemsize)


@pytest.mark.parametrize("offset", range(0, 16))
def test_alignment_head_reaches_a_16_byte_boundary(offset):
    for isz in (2, 4, 8):
        if offset % isz:
            assert cuda_backend.alignment(_fake(4096 + offset, isz), _fake(0, 1), 100) == (0, 0)
            continue
        head, vec = cuda_backend.alignment(_fake(4096 + offset, isz), _fake(8192 + 7, 1), 100)
        assert (4096 + offset + head * isz) % 16 == 0 and 0 <= head < 16 and vec & 1
        assert bool(vec & 2) == ((8192 + 7 + head) % 16 == 0)


def test_alignment_head_never_exceeds_n():
    assert cuda_backend.alignment(_fake(4, 4), _fake(0, 1), 2) == (2, 1)


def test_grid_is_one_unit_per_thread():
    """Never capped at one wave: resident blocks per SM depend on each kernel's registers."""
    assert [cuda_backend.grid(u) for u in (1, 256, 257)] == [1, 1, 2]
    units = 1 + -(-(2**33) // 16)  # 8 Gi elements
    assert cuda_backend.grid(units) * cuda_backend.THREADS >= units and cuda_backend.grid(units) < 2**31


def test_index_map_expands_only_beyond_max_dims():
    from gpuq._scheme import Scheme

    shape = (2,) * 10
    assert Scheme.build(shape, axis=(0, 2, 4, 6, 8)).index_map[0] == "expand"
    assert Scheme.build(shape, axis=(0, 2, 4, 6)).index_map[0] == "strided"
    assert Scheme.build((4, 1, 5), axis=(1,)).index_map[0] == "tensor"
    assert Scheme.build((4, 3, 5), axis=(1, 2)).index_map[:3] == ("channel", 15, 1)


# ---------------------------------------------------------------------------
# GPU


@pytest.fixture
def cp():
    import cupy

    return cupy


def _both(fn, x, *args, **kw):
    """Run ``fn`` on NumPy and CuPy inputs; return both results as NumPy."""
    import cupy

    host = fn(x, *args, **kw)
    dev = fn(cupy.asarray(x), *args, **kw)
    assert isinstance(dev, cupy.ndarray)
    return host, cupy.asnumpy(dev)


_SPECIAL = np.array([0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -2.5, 1e-45, -1e-45, 1.2e-38, np.nan, np.inf,
                     -np.inf, 3e38, -3e38, 126.5, 127.5, -128.5, 254.5, 255.5], np.float32)


@needs_gpu
@pytest.mark.parametrize("zp", [None, 0, 3, -7, 2**23 + 1, 2**31 - 1, -(2**31)])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("fdtype", [np.float16, np.float32, np.float64])
def test_special_values_bit_identical(fdtype, dtype, zp):
    with np.errstate(over="ignore"):  # +-3e38 -> +-inf in float16: one more special value
        x = _SPECIAL.astype(fdtype)
    for s in (1.0, 0.5, 3.0, 1e-40):  # 1e-40: a subnormal float32 scale
        h, d = _both(gpuq.quantize, x, s, zp, dtype=dtype)
        assert np.array_equal(h, d), (s, zp)
        q = np.arange(-128, 128, dtype=np.int8) if dtype == "int8" else np.arange(256, dtype=np.uint8)
        for out in ("float16", "float32", "float64"):
            h, d = _both(gpuq.dequantize, q, s, zp, dtype=out)
            assert np.array_equal(h.view(np.uint8), d.view(np.uint8)), (s, zp, out)


def _stored_bytes(result) -> np.ndarray:
    """The stored bytes of a quantize result (an array of codes or a gpuq.Codes), on the host."""
    import cupy

    data = result.data if isinstance(result, gpuq.Codes) else result
    data = cupy.asnumpy(data) if isinstance(data, cupy.ndarray) else data
    return np.ascontiguousarray(data).view(np.uint8)


#: Scales of the division from a reciprocal (kernels/contract.cuh, Divisor): the guard ends and
#: their outer neighbours (div.rn there), far outside, a subnormal scale, and scales whose
#: reciprocal is inexact (1/127, 1/7, 1/448, 0.3, 3e-5, 1 + 1 ulp).
_DIVISION_SCALES = np.array(
    [2.0**-64, 2.0**64, np.nextafter(np.float32(2.0**-64), 0), np.nextafter(np.float32(2.0**64), np.inf),
     2.0**-70, 2.0**70, 3e-37, 1.5e38, 1e-40, 1 / 127, 1 / 7, 1 / 448, 0.3, 3e-5, 1 + 2.0**-23], np.float32)


def _division_inputs(s: np.float32) -> np.ndarray:
    """x with x / s at and next to every half-integer up to +-300 (where one wrong quotient bit
    moves a rint) and every half step of e4m3's and e5m2's subnormals (2**-9, 2**-16: with a scale
    below 2**-64 those x are subnormal and the residual inexact), and NaN, +-Inf, +-0, subnormals,
    and values whose x * (1/s) overflows."""
    steps = np.arange(-64, 64) + 0.5
    halves = np.concatenate([np.arange(-300, 301) + 0.5, steps * 2.0**-9, steps * 2.0**-16]) * np.float64(s)
    with np.errstate(over="ignore", under="ignore"):
        near = halves.astype(np.float32)
        x = np.concatenate([near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf)),
                            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.1e-38, 3.4e38,
                                      -3.4e38, np.float32(s) * 2.0**100], np.float32)])
    return x.astype(np.float32)


@needs_gpu
@pytest.mark.parametrize("dtype, extra", [
    ("int8", {}), ("uint8", {"zero_point": 128}), ("int4", {}), ("uint4", {"zero_point": 8}),
    ("float8_e4m3fn", {"saturate": True}), ("float8_e4m3fn", {"saturate": False}),
    ("float8_e5m2", {"saturate": True}), ("float8_e5m2", {"saturate": False}),
    ("float4_e2m1fn", {}), ("float6_e3m2fn", {})])
def test_division_from_the_reciprocal_gives_the_ieee_codes(dtype, extra):
    """The kernels' exact division (y = RN(1/s) once, two fused corrections per element) gives
    the host's codes, whose division is IEEE x / s: at quotients on and beside every tie, at the
    guard ends [2**-64, 2**64] and beyond them (div.rn), for every code format."""
    import cupy

    zp = extra.pop("zero_point", None)
    for s in _DIVISION_SCALES:
        x = _division_inputs(s)
        with np.errstate(over="ignore"):
            inputs = (x, x.astype(np.float16), x.astype(np.float64)) if dtype == "int8" else (x,)
        for xs in inputs:
            with np.errstate(all="ignore"):
                host = gpuq.quantize(xs, s, zp, dtype=dtype, **extra)
            dev = gpuq.quantize(cupy.asarray(xs), s, zp, dtype=dtype, **extra)
            h, d = _stored_bytes(host), _stored_bytes(dev)
            bad = np.flatnonzero(h != d)
            assert bad.size == 0, (float(s), xs.dtype, xs.ravel()[bad[:3]], h[bad[:3]], d[bad[:3]])


_SCHEMES = [
    ((1025,), None, None),
    ((17, 33), 0, None),
    ((17, 33), 1, None),
    ((5, 7, 9), 1, None),
    ((3, 4, 5, 6), (0, 2), None),
    ((3, 4, 5, 6), (1, 3), None),
    ((8, 37), 1, 8),
    ((8, 40), 1, 8),
    ((9, 7, 5), 1, 3),
    ((2,) * 10, (0, 2, 4, 6, 8), None),
]


@needs_gpu
@pytest.mark.parametrize("shape, axis, group", _SCHEMES,
                         ids=[f"{s}-axis{a}-g{g}" for s, a, g in _SCHEMES])
@pytest.mark.parametrize("with_zp", [False, True])
def test_every_scheme_matches_numpy(shape, axis, group, with_zp):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 40).astype(np.float32)
    pshape = gpuq._scheme.Scheme.build(shape, axis, group).param_shape
    s = rng.uniform(0.1, 2.0, pshape).astype(np.float32)
    z = rng.integers(-20, 20, pshape).astype(np.int32) if with_zp else None
    h, d = _both(gpuq.quantize, x, s, z, axis=axis, group_size=group)
    assert np.array_equal(h, d)
    h2, d2 = _both(gpuq.dequantize, h, s, z, axis=axis, group_size=group)
    assert np.array_equal(h2, d2)


#: Decodes long enough for whole warps (512 elements): the warp-contiguous spans, with scales
#: changing inside a span (channel rows of 37, groups of 20 and 128, 2-D blocks) and the staged
#: path of the head's and the tail's warps. (shape, scheme keywords).
_DECODE_SCHEMES = [
    ((1537,), {}),
    ((5, 370), {"axis": 0}),
    ((3, 700), {"axis": 1, "group_size": 20}),
    ((2, 1100), {"axis": 1, "group_size": 128}),
    ((130, 300), {"block_size": (128, 128)}),
]


@needs_gpu
@pytest.mark.parametrize("shape, kw", _DECODE_SCHEMES, ids=[f"{s}-{k}" for s, k in _DECODE_SCHEMES])
@pytest.mark.parametrize("code", ["int8", "uint8", "float8_e4m3fn", "int4"])
@pytest.mark.parametrize("start", [0, 1])
def test_warp_contiguous_decode_matches_numpy(cp, shape, kw, code, start):
    """Every decode through the warp-contiguous spans (4 codes in, 4 outputs out per lane):
    each output dtype, code views at offsets that keep or break the vectors, bit for bit."""
    rng = np.random.default_rng(start)
    n = int(np.prod(shape))
    x = (rng.standard_normal(n + start) * 40).astype(np.float32)
    x[::53] = np.nan
    pshape = gpuq._scheme.Scheme.build(shape, kw.get("axis"), kw.get("group_size"), kw.get("block_size")).param_shape
    s = rng.uniform(0.1, 2.0, pshape).astype(np.float32)
    z = rng.integers(-20, 20, pshape).astype(np.int32) if code == "int8" else None
    z = rng.integers(100, 150, pshape).astype(np.int32) if code == "uint8" else z
    z = rng.integers(-8, 8, pshape).astype(np.int32) if code == "int4" else z
    q = gpuq.quantize(x[start:].reshape(shape), s, z, dtype=code, **kw)
    for out in ("float32", "float16", "bfloat16", "float64"):
        if isinstance(q, gpuq.Codes):  # int4: packed bytes, no view; the start moves the floats only
            qd = gpuq.Codes(cp.asarray(q.data), q.shape, code)
        else:  # a view `start` bytes into a device buffer (fp8 codes as their bits)
            bits = np.concatenate([np.zeros(start, np.uint8), q.reshape(-1).view(np.uint8)])
            qd = cp.asarray(bits)[start:].reshape(shape)
            qd = qd.view(q.dtype) if code in ("int8", "uint8") else gpuq.Codes(qd, shape, code)
        h = gpuq.dequantize(q, s, z, dtype=out, **kw)
        d = cp.asnumpy(gpuq.dequantize(qd, s, z, dtype=out, **kw))
        size = np.dtype(h.dtype).itemsize
        assert np.array_equal(h.view(f"u{size}"), d.view(f"u{size}")), out


@needs_gpu
@pytest.mark.parametrize("start", range(0, 17))
def test_misaligned_views_and_strided_inputs(cp, start):
    rng = np.random.default_rng(start)
    x = (rng.standard_normal(1000) * 50).astype(np.float32)
    xd = cp.asarray(x)
    h = gpuq.quantize(x[start:], 0.5, 3)
    assert np.array_equal(h, cp.asnumpy(gpuq.quantize(xd[start:], 0.5, 3)))
    # misaligned out as well (a view of a larger array)
    big = cp.zeros(1100, cp.int8)
    res = gpuq.quantize(xd[start:], 0.5, 3, out=big[start + 1:start + 1 + h.size])
    assert np.array_equal(h, cp.asnumpy(res))
    # non-contiguous src and out
    h2 = gpuq.quantize(x[start::3], 0.5, 3)
    out = cp.zeros(2 * h2.size, cp.int8)[::2]
    assert gpuq.quantize(xd[start::3], 0.5, 3, out=out) is out
    assert np.array_equal(h2, cp.asnumpy(out))
    y = gpuq.dequantize(h2, 0.5, 3, dtype="float16")
    yd = gpuq.dequantize(cp.asarray(h2)[1:], 0.5, 3, dtype="float16")
    assert np.array_equal(y[1:].view(np.uint16), cp.asnumpy(yd).view(np.uint16))


@needs_gpu
def test_result_on_src_device_not_device_0(cp):
    dev = cp.cuda.runtime.getDeviceCount() - 1
    with cp.cuda.Device(dev):
        x = cp.linspace(-3, 3, 1001, dtype=cp.float32)
    q = gpuq.quantize(x, [0.1], axis=None)
    assert q.device.id == dev
    assert gpuq.dequantize(q, 0.1).device.id == dev


@needs_gpu
def test_params_on_another_device_are_a_type_error(cp):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cp.cuda.Device(1):
        x = cp.ones(10, cp.float32)
    s = cp.ones((), cp.float32)  # device 0
    with pytest.raises(TypeError, match="device"):
        gpuq.quantize(x, s)


@needs_gpu
def test_host_src_with_device_scales_is_a_type_error(cp):
    with pytest.raises(TypeError, match="scales is a device"):
        gpuq.quantize(np.ones(4, np.float32), cp.ones((), cp.float32))
    with pytest.raises(TypeError, match="zps is a device"):
        gpuq.quantize(np.ones(4, np.float32), 1.0, cp.zeros((), cp.int32))


@needs_gpu
def test_device_scales_are_checked_unless_skipped(cp):
    x = cp.ones(8, cp.float32)
    with pytest.raises(ValueError, match=r"scales must be finite and > 0.*at index \(2,\)"):
        gpuq.quantize(cp.ones((2, 4), cp.float32), cp.asarray([1.0, 1.0, 0.0, 1.0], cp.float32), axis=1)
    with pytest.raises(ValueError, match="scales must be finite and > 0"):
        gpuq.quantize(x, cp.asarray(np.nan, cp.float32))
    # check_values=False skips the device reduction (the caller vouches for the values)
    gpuq.quantize(x, cp.asarray(1.0, cp.float32), check_values=False)
    with pytest.raises(ValueError, match="zps must fit int32"):
        gpuq.quantize(x, 1.0, cp.asarray(2**40, cp.int64))


@needs_gpu
def test_launches_on_the_current_stream(cp, monkeypatch):
    seen = []
    real = cuda_backend.get_function

    def spy(*args):
        fn = real(*args)

        def call(grid, block, kargs, stream=None):
            seen.append(stream)
            return fn(grid, block, kargs, stream=stream)

        return call

    monkeypatch.setattr(cuda_backend, "get_function", spy)
    x = cp.arange(100, dtype=cp.float32)
    # x was written on the legacy default stream, which a non-blocking stream does not wait for.
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        q = gpuq.quantize(x, 2.0)
        y = gpuq.dequantize(q, 2.0)
    stream.synchronize()
    assert [s.ptr for s in seen] == [stream.ptr] * 2
    assert np.array_equal(cp.asnumpy(y), np.rint(np.arange(100) / 2) * 2)


@needs_gpu
def test_static_op_uploads_once_per_device(cp, monkeypatch):
    calls = []
    from gpuq.backends.cuda.backend import CudaBackend

    real = CudaBackend.to_param

    def counting(arr, src):
        calls.append(isinstance(arr, np.ndarray))
        return real(arr, src)

    monkeypatch.setattr(CudaBackend, "to_param", staticmethod(counting))
    op = gpuq.Quantize(scales=[0.5, 0.25], zps=[1, -1], qtype="per_channel", axis=1)
    x = cp.ones((3, 2), cp.float32)
    first = op(x)
    uploads = calls.count(True)
    second = op(x)
    assert calls.count(True) == uploads == 2  # scales and zps, once
    assert np.array_equal(cp.asnumpy(first), cp.asnumpy(second))


def _kernel_names(monkeypatch):
    """The kernel names the CUDA backend launches from now on."""
    names = []
    real = cuda_backend.get_function

    def spy(source, group, name):
        names.append(name)
        return real(source, group, name)

    monkeypatch.setattr(cuda_backend, "get_function", spy)
    return names


@needs_gpu
@pytest.mark.parametrize("fdtype", [np.float16, np.float32, np.float64])
def test_one_host_parameter_goes_by_value(cp, monkeypatch, fdtype):
    """A host scale and zp of one element reach the kernel by value (MAP 4, no
    upload); device ones, and a host value paired with a device one, are read
    from device memory: every combination gives the host backend's bits."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((17, 33)) * 40).astype(fdtype)
    xd = cp.asarray(x)
    names = _kernel_names(monkeypatch)
    value = f", {cuda_backend.registry.MAPS['value']}>"
    s, z = np.float32(0.37), np.int32(-5)
    want = gpuq.quantize(x, s, z)
    for sp, zp, by_value in [(float(s), int(z), True), (np.array([s]), np.array([z]), True),
                             (np.array(s), None, True),
                             (cp.asarray(s), cp.asarray(z), False), (float(s), cp.asarray(z), False),
                             (cp.asarray([s]), int(z), False)]:
        names.clear()
        got = gpuq.quantize(xd, sp, zp)
        expect = want if zp is not None else gpuq.quantize(x, s)
        assert np.array_equal(cp.asnumpy(got), expect), (type(sp), type(zp))
        assert names[-1].endswith(value) == by_value, names
        back = gpuq.dequantize(got, sp, zp, dtype=fdtype)
        ref = gpuq.dequantize(expect, s, None if zp is None else z, dtype=fdtype)
        assert np.array_equal(cp.asnumpy(back).view(np.uint8), ref.view(np.uint8))
    # one channel, or one group, is one value too
    for kw, pshape in [({"axis": 0}, (1,)), ({"axis": 1, "group_size": 64}, (1, 1))]:
        names.clear()
        sp, zp = np.full(pshape, 0.25, np.float32), np.full(pshape, 3, np.int32)
        got = gpuq.quantize(xd[:1], sp, zp, **kw)
        assert np.array_equal(cp.asnumpy(got), gpuq.quantize(x[:1], sp, zp, **kw))
        assert names[-1].endswith(value), names


@needs_gpu
@pytest.mark.parametrize("qdtype", ["int8", "uint8"])
def test_static_ops_with_one_value_on_device(cp, monkeypatch, qdtype):
    """gpuq.Quantize/Dequantize per-tensor: the cached parameters stay host values
    (no upload, the value map), and the device result is the host op's."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(4097) * 60).astype(np.float32)
    zp = 130 if qdtype == "uint8" else -3
    qop = gpuq.Quantize(scales=[0.41], zps=[zp], dtype=qdtype)
    dop = gpuq.Dequantize(scales=[0.41], zps=[zp], dtype="float16")
    names = _kernel_names(monkeypatch)
    for _ in range(2):  # the second call takes the op's cached parameters
        q = qop(cp.asarray(x))
        assert np.array_equal(cp.asnumpy(q), qop(x))
        y = dop(q)
        assert np.array_equal(cp.asnumpy(y).view(np.uint16), dop(qop(x)).view(np.uint16))
    value = f", {cuda_backend.registry.MAPS['value']}>"
    assert len(names) == 4 and all(n.endswith(value) for n in names), names
    params, _readers = qop._device_params[next(iter(qop._device_params))]
    assert all(isinstance(p, np.ndarray) for p in params)


@needs_gpu
def test_op_uploads_outlive_the_op_until_other_streams_pass(cp):
    """Issue 26: an op object collected while a kernel on another stream may still read its
    uploaded parameters must not return them to CuPy's pool (whose next allocation on the
    uploading stream would reuse the block at once): they wait until that stream passes."""
    import gc
    import weakref

    from gpuq.backends.cuda.launch import StreamReaders

    host = np.arange(2 * 4099, dtype=np.float32).reshape(4099, 2) - 4000.0
    op = gpuq.Quantize(scales=[0.5, 0.25], qtype="per_channel", axis=1)
    xx = cp.asarray(host)
    want = op(host)
    np.testing.assert_array_equal(cp.asnumpy(op(xx)), want)  # uploads on the default stream
    (params, readers), = [v for k, v in op._device_params.items() if k[0][0] == "cuda"]
    alive = weakref.ref(params[0])
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        got = op(xx)  # read on another stream
    assert set(readers.events) == {side.ptr}
    del op, params, readers
    gc.collect()
    if not side.done:  # still queued (always on the CPU execution): the block is held
        assert alive() is not None
    side.synchronize()
    StreamReaders._sweep()
    gc.collect()
    assert alive() is None and not StreamReaders._waiting
    np.testing.assert_array_equal(cp.asnumpy(got), want)


class _CAIOnly:
    """An object exposing only __cuda_array_interface__ (like a Numba array)."""

    def __init__(self, arr):
        self._arr = arr

    @property
    def __cuda_array_interface__(self):
        return self._arr.__cuda_array_interface__


class _DLPackOnly:
    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, *args, **kwargs):
        return self._arr.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


@needs_gpu
@pytest.mark.parametrize("wrap", [_CAIOnly, _DLPackOnly])
def test_cuda_array_objects_are_used_zero_copy(cp, wrap):
    x = cp.linspace(-5, 5, 257, dtype=cp.float32)
    q = gpuq.quantize(wrap(x), 0.1)
    assert isinstance(q, cp.ndarray)
    assert np.array_equal(cp.asnumpy(q), gpuq.quantize(cp.asnumpy(x), 0.1))
    assert cuda_backend.as_cupy(wrap(x)).data.ptr == x.data.ptr
    out = cp.empty(257, cp.int8)
    assert gpuq.quantize(x, 0.1, out=wrap(out)).__class__ is wrap
    assert np.array_equal(cp.asnumpy(out), cp.asnumpy(q))


@needs_gpu
def test_torch_tensors(cp):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.linspace(-5, 5, 1001, device="cuda")
    q = gpuq.quantize(t, 0.1, 3, dtype="uint8")
    assert np.array_equal(cp.asnumpy(q), gpuq.quantize(t.cpu().numpy(), 0.1, 3, dtype="uint8"))
    out = torch.empty(1001, dtype=torch.uint8, device="cuda")
    assert gpuq.quantize(t, 0.1, 3, out=out) is out
    assert np.array_equal(out.cpu().numpy(), cp.asnumpy(q))


# ---------------------------------------------------------------------------
# The GPU benchmark's own GPU pieces (bench/timing.py, bench/peers_gpu.py): checked here in
# seconds, before a long `python -m bench` run depends on them.


def _bench():
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    return pytest.importorskip("bench")


@needs_gpu
@pytest.mark.real_cupy  # an inline-PTX %globaltimer spin and event timing: real hardware only
def test_bench_event_timer_hides_the_launch(cp):
    _bench()
    from bench.timing import CupyEvents, time_gpu

    ev = CupyEvents(cp)
    assert ev.spin(1e-4), "the spin kernel (%globaltimer) did not build or did not spin"
    x = cp.ones(1 << 20, cp.float32)
    y = cp.empty_like(x)
    t = time_gpu(lambda i: cp.copyto(y, x), ev, reps=20)
    assert t["launch_hidden"] and t["spin_s"] > 0
    # 8 MiB moved: a few us on any recent GPU, far below the spin that hid the host's work.
    assert t["median_s"] < t["spin_s"]


@needs_gpu
@pytest.mark.real_cupy  # the bench's inputs come from cupy.random, which the CPU execution lacks
@pytest.mark.parametrize("op,fdtype,qdtype", [("quantize", "float32", "int8"), ("quantize", "float16", "uint8"),
                                              ("dequantize", "float32", "uint8"),
                                              ("dequantize", "float16", "int8")])
def test_bench_elementwise_peer_runs_and_matches(cp, op, fdtype, qdtype):
    _bench()
    from bench import data, runner
    from bench.cases import Case
    from bench.peers_gpu import CupyElementwise, CupyNaive

    case = Case(op, "last", 1 << 16, 64, fdtype, qdtype)
    x = data.device_input(case, cp)
    scales, zps = data.host_params_for(case)
    ref = data.reference(case, x, scales, zps, cp.asnumpy)
    for peer in (CupyElementwise(1), CupyNaive(1)):
        prep = peer.prepare(case, [x], scales, zps)
        got = runner.compare(ref, prep.fetch(prep.run(0)))
        # One IEEE division / multiplication like gpuq: at most a handful of rounding differences.
        assert got["mismatches"] <= case.numel() // 1000, (peer.name, got)
