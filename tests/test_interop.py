"""The caller's stream, device and array type (gpuq/_interop.py), checked without a GPU.

On the CPU execution of the kernels (tests/cudasim) streams are ordered queues
that run at synchronisation points, so reading data on the wrong stream gives
stale values, and every launch and host synchronisation is recorded. A small
stand-in for torch (a module put in ``sys.modules`` for one test) gives CUDA
tensors the way torch does: ``__cuda_array_interface__`` version 2 without a
stream (refused when the tensor requires grad), ``torch.cuda.current_stream``,
``torch.from_dlpack``. Real torch tensors on a GPU are checked by the device
check's torch step (bench/gpu_torch_checks.py); real CPU torch tensors here
(the test extra installs torch): ``requires_grad`` and ``nn.Parameter``,
non-contiguous views, ``out=``, bfloat16 and fp8 in and out.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import gpuq
from conftest import CUDA_MODE

sim = pytest.mark.skipif(CUDA_MODE != "sim", reason="needs the CPU execution's stream queues and records")


@pytest.fixture
def cp():
    import cupy

    return cupy


def _x(n=1025, seed=0):
    return (np.random.default_rng(seed).standard_normal(n) * 30).astype(np.float32)


def _read(cp, arr, stream):
    """``arr`` on the host after ``stream`` (where it was written) has finished, as its owner reads it."""
    stream.synchronize()
    return cp.asnumpy(arr)


def _written_on(cp, stream, host):
    """A device array whose contents are written by work still queued on ``stream``."""
    with stream:
        dev = cp.zeros(host.shape, host.dtype)
        dev[...] = cp.asarray(host)
    return dev


# -- a stand-in for torch ----------------------------------------------------------------------

class _Device:
    def __init__(self, index):
        self.type, self.index = "cuda", index


class _FakeTorchTensor:
    def __init__(self, arr, torch, requires_grad=False):
        self._arr, self._torch, self.requires_grad = arr, torch, requires_grad
        self.device = _Device(arr.device.id)
        self.dtype = arr.dtype  # torch has its own dtype objects; only bfloat16 is compared

    @property
    def __cuda_array_interface__(self):
        if self.requires_grad:  # as torch does
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad. "
                               "Use var.detach().__cuda_array_interface__ instead.")
        cai = dict(self._arr.__cuda_array_interface__)
        cai["version"] = 2  # torch exports version 2: no stream entry
        cai.pop("stream", None)
        return cai

    @property
    def shape(self):
        return self._arr.shape

    def is_contiguous(self):
        return bool(self._arr.flags.c_contiguous)

    def detach(self):
        t = _FakeTorchTensor(self._arr, self._torch)
        t.dtype = self.dtype
        return t

    def view(self, dtype):
        """torch's same-size reinterpretation: fp8 dtypes are names here, their storage uint8."""
        t = _FakeTorchTensor(self._arr.view(np.uint8) if isinstance(dtype, str) else self._arr.view(dtype),
                             self._torch, self.requires_grad)
        if isinstance(dtype, str):
            t.dtype = dtype
        return t


@pytest.fixture
def fake_torch(cp, monkeypatch):
    """``torch`` with one CUDA stream per device that is current (non-blocking, like a side stream)."""
    torch = types.ModuleType("torch")
    streams = {}
    for d in range(cp.cuda.runtime.getDeviceCount()):
        with cp.cuda.Device(d):
            streams[d] = cp.cuda.Stream(non_blocking=True)
    torch.Tensor = _FakeTorchTensor
    torch.bfloat16 = object()  # torch's bfloat16 dtype object: no tensor here has it
    torch.uint8 = np.dtype(np.uint8)
    torch.float8_e4m3fn, torch.float8_e5m2 = "float8_e4m3fn", "float8_e5m2"  # compared by identity
    torch.streams = streams
    torch.dlpack_streams = []

    def current_stream(device):
        with cp.cuda.Device(device.index):
            return types.SimpleNamespace(cuda_stream=streams[device.index].ptr)

    def from_dlpack(obj):
        dev = int(obj.__dlpack_device__()[1])
        torch.dlpack_streams.append(streams[dev].ptr)
        with cp.cuda.Device(dev), streams[dev]:
            return _FakeTorchTensor(cp.from_dlpack(obj), torch)

    torch.cuda = types.SimpleNamespace(current_stream=current_stream, current_device=lambda: 0)
    torch.from_dlpack = from_dlpack
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


@sim
def test_torch_tensors_run_on_torchs_current_stream(cp, fake_torch):
    x = _x()
    side = fake_torch.streams[0]
    t = fake_torch.Tensor(_written_on(cp, side, x), fake_torch)
    cp._sim.launches.clear()
    q = gpuq.quantize(t, 0.25, 3)
    # torch in, torch out; the launch went to torch's stream, after torch's own work there.
    assert isinstance(q, fake_torch.Tensor) and q.device.index == 0
    assert {r.stream_ptr for r in cp._sim.launches} == {side.ptr}
    assert fake_torch.dlpack_streams == [side.ptr]
    assert np.array_equal(_read(cp, q._arr, side), gpuq.quantize(x, 0.25, 3))


@sim
def test_the_stream_rule_matters(cp, fake_torch):
    """The control: the same tensor read on CuPy's current stream (what gpuq did before)
    sees the zeros that precede torch's queued write."""
    x = _x()
    t = fake_torch.Tensor(_written_on(cp, fake_torch.streams[0], x), fake_torch)
    stale = gpuq.quantize(cp.asarray(t), 0.25, 3)
    assert not np.array_equal(_read(cp, stale, cp.cuda.get_current_stream()), gpuq.quantize(x, 0.25, 3))


@sim
def test_tensors_that_require_grad_are_read_as_detached(cp, fake_torch):
    x = _x(17)
    t = fake_torch.Tensor(_written_on(cp, fake_torch.streams[0], x), fake_torch, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        t.__cuda_array_interface__  # noqa: B018  (the stand-in refuses as torch does)
    s, z = gpuq.choose_qparams(t, dtype="uint8")
    q, s2, z2 = gpuq.quantize_dynamic(t, dtype="uint8")
    assert all(isinstance(a, fake_torch.Tensor) for a in (s, z, q, s2, z2))
    fake_torch.streams[0].synchronize()
    hs, hz = gpuq.choose_qparams(x, dtype="uint8")
    assert np.array_equal(cp.asnumpy(s._arr), hs) and np.array_equal(cp.asnumpy(z._arr), hz)
    assert np.array_equal(cp.asnumpy(q._arr), gpuq.quantize(x, hs, hz, dtype="uint8"))
    op = gpuq.Quantize(scales=[0.5], dtype="u8")
    assert isinstance(op(t), fake_torch.Tensor)


@sim
def test_out_comes_back_as_given(cp, fake_torch):
    x = _x(33)
    t = fake_torch.Tensor(_written_on(cp, fake_torch.streams[0], x), fake_torch)
    out = fake_torch.Tensor(_written_on(cp, fake_torch.streams[0], np.zeros(33, np.int8)), fake_torch)
    assert gpuq.quantize(t, 0.5, out=out) is out
    assert np.array_equal(_read(cp, out._arr, fake_torch.streams[0]), gpuq.quantize(x, 0.5))


# -- DLPack producers --------------------------------------------------------------------------

class _Producer:
    """A CUDA array of another library: its data written on its own non-blocking stream."""

    def __init__(self, cp, host, honour_stream=True):
        self.side = cp.cuda.Stream(non_blocking=True)
        self.arr = _written_on(cp, self.side, host)
        self.honour_stream, self.asked = honour_stream, []

    def __dlpack__(self, *, stream=None, **kwargs):
        self.asked.append(stream)
        with self.side:  # the producer's work is on its stream; the export orders the consumer after it
            # -1 is DLPack's "do not synchronise": a producer that skips the handshake
            return self.arr.__dlpack__(stream=stream if self.honour_stream else -1, **kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


@sim
def test_dlpack_producers_hand_over_through_the_stream_protocol(cp):
    x = _x()
    p = _Producer(cp, x)
    q = gpuq.quantize(p, 0.25)
    assert isinstance(q, cp.ndarray)
    # The legacy default stream: 1 in DLPack's handshake and in the launch record (cudaStreamLegacy).
    consumer = cp.cuda.get_current_stream().ptr or 1
    assert p.asked == [consumer] and {r.stream_ptr for r in cp._sim.launches} == {consumer}
    assert np.array_equal(cp.asnumpy(q), gpuq.quantize(x, 0.25))
    # The control: a producer that ignores the consumer's stream is read too early.
    bad = gpuq.quantize(_Producer(cp, x, honour_stream=False), 0.25)
    assert not np.array_equal(cp.asnumpy(bad), gpuq.quantize(x, 0.25))


@sim
def test_cupy_arrays_run_on_cupys_current_stream(cp):
    x = _x()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        xd = cp.asarray(x)
        q = gpuq.quantize(xd, 0.25)
    assert {r.stream_ptr for r in cp._sim.launches} == {s.ptr}
    assert np.array_equal(_read(cp, q, s), gpuq.quantize(x, 0.25))


# -- no synchronisation on the call path -------------------------------------------------------

@sim
@pytest.mark.parametrize("shape, axis, group", [((1025,), None, None), ((7, 33), 1, None),
                                                ((10, 5), 0, 3), ((3, 4, 5), (0, 2), None)])
def test_device_parameters_and_no_check_mean_no_host_synchronisation(cp, shape, axis, group):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    pshape = gpuq._scheme.Scheme.build(shape, axis, group).param_shape
    s = cp.asarray(rng.uniform(0.1, 1, pshape).astype(np.float32))
    z = cp.asarray(rng.integers(-5, 5, pshape).astype(np.int32))
    xd = cp.asarray(x)
    kw = dict(axis=axis, group_size=group, check_values=False)
    strided = gpuq._scheme.Scheme.build(shape, axis, group).index_map[0] == "strided"
    from gpuq.backends.cuda import launch as cuda_backend

    cuda_backend.dims_array.cache_clear()  # a first call here, whatever ran before
    for first in (True, False):
        cp._sim.syncs.clear()
        q = gpuq.quantize(xd, s, z, **kw)
        y = gpuq.dequantize(q, s, z, **kw)
        # The one exception: the first call of a strided scheme on a device waits once for
        # the upload of its dims; every later call (graph-capturable) never synchronises.
        assert len(cp._sim.syncs) == (1 if first and strided else 0), cp._sim.syncs
    assert np.array_equal(cp.asnumpy(y), gpuq.dequantize(gpuq.quantize(x, cp.asnumpy(s), cp.asnumpy(z), axis=axis,
                                                                       group_size=group), cp.asnumpy(s),
                                                         cp.asnumpy(z), axis=axis, group_size=group))


# -- several devices ---------------------------------------------------------------------------

@sim
def test_everything_runs_on_src_device_not_the_current_one(cp):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 9))
    s = rng.uniform(0.1, 1, 9)  # float64 scales for float32 src: converted on the device
    z = rng.integers(-3, 3, 9).astype(np.int8)  # int8 zero points: widened on the device
    with cp.cuda.Device(1):
        xd = cp.asarray(x.astype(np.float32))
        sd = cp.asarray(np.stack([s, s]))[0]  # a view: not contiguous after the stack? it is; keep the dtype change
        zd = cp.asarray(z)
        x64 = cp.asarray(x)
    assert cp.cuda.Device().id == 0
    q = gpuq.quantize(xd, sd, zd, axis=1)
    assert q.device.id == 1 and {r.device_id for r in cp._sim.launches} == {1}
    assert np.array_equal(cp.asnumpy(q), gpuq.quantize(x.astype(np.float32), s, z, axis=1))
    # The float64 two-pass path of quantize_dynamic (choose, then quantize with widened scales).
    q2, s2, z2 = gpuq.quantize_dynamic(x64, axis=(1,))
    h = gpuq.quantize_dynamic(x, axis=(1,))
    assert q2.device.id == 1 and all(np.array_equal(cp.asnumpy(a), b) for a, b in zip((q2, s2, z2), h))
    with cp.cuda.Device(0):
        other = cp.asarray(s)  # float64: a conversion before the device check would hide it
    with pytest.raises(TypeError, match="device"):
        gpuq.quantize(xd, other, axis=1)


# -- op objects --------------------------------------------------------------------------------

@sim
def test_op_parameters_uploaded_on_one_stream_are_safe_on_another(cp):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    s = rng.uniform(0.1, 1, 7).astype(np.float32)
    op = gpuq.Quantize(scales=s, zps=np.arange(7), qtype="per_channel", axis=1)
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with a:
        xa = cp.asarray(x)
        op(xa)  # uploads the parameters on stream a (queued there)
    with b:
        xb = cp.asarray(x)
        q = op(xb)  # stream b must wait for a's upload on the device
    assert np.array_equal(_read(cp, q, b), op(x))


# -- host arrays of other libraries ------------------------------------------------------------

def test_cpu_torch_tensors_come_back_as_torch():
    torch = pytest.importorskip("torch")
    x = _x(17)
    t = torch.from_numpy(x.copy()).requires_grad_(True)
    q = gpuq.quantize(t, 0.25, 3)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.int8
    assert np.array_equal(q.numpy(), gpuq.quantize(x, 0.25, 3))
    y = gpuq.dequantize(q, 0.25, 3)
    assert isinstance(y, torch.Tensor) and np.array_equal(y.numpy(), gpuq.dequantize(q.numpy(), 0.25, 3))


def test_cpu_torch_bfloat16_in_and_out():
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = _x(1025).astype(ml_dtypes.bfloat16)
    t = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    q = gpuq.quantize(t, 0.25, 3)
    assert isinstance(q, torch.Tensor) and np.array_equal(q.numpy(), gpuq.quantize(x, 0.25, 3))
    y = gpuq.dequantize(q, 0.25, 3, dtype="bfloat16")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    want = gpuq.dequantize(q.numpy(), 0.25, 3, dtype="bfloat16")
    assert np.array_equal(y.view(torch.int16).numpy(), want.view(np.int16))


@sim
def test_strided_dims_are_ready_for_any_stream_and_on_src_device(cp):
    """A multi-axis scheme's dims, uploaded by a first call on one stream (queued there),
    are read by a second call on another stream at once; on device 1 they live on device 1."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    s = rng.uniform(0.1, 1, (3, 5)).astype(np.float32)
    want = gpuq.quantize(x, s, axis=(0, 2))
    for dev in (1, 0):
        with cp.cuda.Device(dev):
            a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
            xd, sd = cp.asarray(x), cp.asarray(s)
            cp.cuda.runtime.deviceSynchronize()
            with a:
                qa = gpuq.quantize(xd, sd, axis=(0, 2))
            with b:
                qb = gpuq.quantize(xd, sd, axis=(0, 2))
            assert np.array_equal(_read(cp, qb, b), want) and np.array_equal(_read(cp, qa, a), want)


@sim
def test_parameters_that_require_grad_as_scales_zps_and_out(cp, fake_torch):
    x = _x(33)
    side = fake_torch.streams[0]
    t = fake_torch.Tensor(_written_on(cp, side, x), fake_torch)
    s = fake_torch.Tensor(_written_on(cp, side, np.full(1, 0.25, np.float32)), fake_torch, requires_grad=True)
    out = fake_torch.Tensor(_written_on(cp, side, np.zeros(33, np.int8)), fake_torch, requires_grad=True)
    assert gpuq.quantize(t, s, out=out) is out
    assert np.array_equal(_read(cp, out._arr, side), gpuq.quantize(x, 0.25))


# -- the new code formats through the interop layer ---------------------------------------------

@sim
def test_torch_fp8_and_int4_in_and_out(cp, fake_torch):
    x = _x(1025)
    t = fake_torch.Tensor(_written_on(cp, fake_torch.streams[0], x), fake_torch)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        q = gpuq.quantize(t, 0.25, dtype=name)
        # torch has fp8 types: a torch fp8 tensor over the kernel's bits, on torch's stream.
        assert isinstance(q, fake_torch.Tensor) and q.dtype == name
        host = gpuq.quantize(x, 0.25, dtype=name)
        assert np.array_equal(_read(cp, q._arr, fake_torch.streams[0]), host.view(np.uint8))
        y = gpuq.dequantize(q, 0.25)  # an fp8 tensor in: read as its dtype's codes
        assert isinstance(y, fake_torch.Tensor)
        assert np.array_equal(_read(cp, y._arr, fake_torch.streams[0]).view(np.uint32),
                              gpuq.dequantize(host, 0.25).view(np.uint32))
    c = gpuq.quantize(t, 0.25, 3, dtype="uint4")
    assert isinstance(c, gpuq.Codes) and isinstance(c.data, fake_torch.Tensor)  # torch bytes inside
    host = gpuq.quantize(x, 0.25, 3, dtype="uint4")
    assert np.array_equal(_read(cp, c.data._arr, fake_torch.streams[0]), host.data)
    y = gpuq.dequantize(c, 0.25, 3)  # Codes of torch bytes: the work on torch's stream again
    assert isinstance(y, fake_torch.Tensor)
    assert np.array_equal(_read(cp, y._arr, fake_torch.streams[0]), gpuq.dequantize(host, 0.25, 3))
    assert {r.stream_ptr for r in cp._sim.launches} == {fake_torch.streams[0].ptr}


# -- a stand-in for JAX ------------------------------------------------------------------------------

class _FakeJaxArray:
    """A JAX array: GPU ones export DLPack only (honouring the consumer's stream), host ones
    ``__array__``; ``jax.dlpack.from_dlpack`` imports one."""

    def __init__(self, data, log, stream=None):
        self._data, self._log, self._stream = data, log, stream  # stream: where it was written

    def __dlpack__(self, *, stream=None, **kwargs):
        self._log.append(stream)
        if self._stream is None:
            return self._data.__dlpack__(stream=stream, **kwargs)
        with self._stream:  # the export orders the consumer's stream after the producer's work
            return self._data.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self):
        if isinstance(self._data, np.ndarray):
            return (1, 0)  # kDLCPU
        return self._data.__dlpack_device__()

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._data, dtype)


@pytest.fixture
def fake_jax(cp, monkeypatch):
    jax = types.ModuleType("jax")
    jax.Array = _FakeJaxArray
    jax.log = []
    jax.dlpack = types.SimpleNamespace(from_dlpack=lambda obj: _FakeJaxArray(cp.from_dlpack(obj), jax.log))
    jax.numpy = types.SimpleNamespace(asarray=lambda a: _FakeJaxArray(np.asarray(a), jax.log))
    monkeypatch.setitem(sys.modules, "jax", jax)
    return jax


@sim
def test_jax_gpu_arrays_through_dlpack_and_back(cp, fake_jax):
    x = _x(1025)
    side = cp.cuda.Stream(non_blocking=True)
    a = _FakeJaxArray(_written_on(cp, side, x), fake_jax.log, side)
    q = gpuq.quantize(a, 0.25, 3)
    assert isinstance(q, _FakeJaxArray)  # JAX in, JAX out
    consumer = cp.cuda.get_current_stream().ptr or 1
    # The DLPack handshake was asked for CuPy's current stream, and the launch ran there.
    assert fake_jax.log == [consumer] and {r.stream_ptr for r in cp._sim.launches} == {consumer}
    assert np.array_equal(cp.asnumpy(q._data), gpuq.quantize(x, 0.25, 3))
    y = gpuq.dequantize(q, 0.25, 3)
    assert isinstance(y, _FakeJaxArray)
    assert np.array_equal(cp.asnumpy(y._data), gpuq.dequantize(gpuq.quantize(x, 0.25, 3), 0.25, 3))


def test_jax_host_arrays_come_back_as_jax(fake_jax):
    x = _x(17)
    a = _FakeJaxArray(x, fake_jax.log)
    q = gpuq.quantize(a, 0.25)
    assert isinstance(q, _FakeJaxArray) and np.array_equal(np.asarray(q), gpuq.quantize(x, 0.25))
    s, z = gpuq.choose_qparams(a, dtype="uint8")
    assert isinstance(s, _FakeJaxArray) and isinstance(z, _FakeJaxArray)


def test_cpu_torch_out_and_new_formats():
    torch = pytest.importorskip("torch")
    x = _x(1025)
    t = torch.from_numpy(x.copy())
    out = torch.empty(1025, dtype=torch.int8)
    assert gpuq.quantize(t, 0.25, out=out) is out  # written in place through a NumPy view
    assert np.array_equal(out.numpy(), gpuq.quantize(x, 0.25))
    for name in ("float8_e4m3fn", "float8_e5m2"):
        q = gpuq.quantize(t, 0.25, dtype=name)
        assert q.dtype == getattr(torch, name)
        host = gpuq.quantize(x, 0.25, dtype=name)
        assert np.array_equal(q.view(torch.uint8).numpy(), host.view(np.uint8))
        y = gpuq.dequantize(q, 0.25)
        assert isinstance(y, torch.Tensor) and np.array_equal(y.numpy().view(np.uint32),
                                                              gpuq.dequantize(host, 0.25).view(np.uint32))
    c = gpuq.quantize(t, 0.25, dtype="int4")
    assert isinstance(c.data, torch.Tensor) and c.data.dtype == torch.uint8
    assert np.array_equal(c.data.numpy(), gpuq.quantize(x, 0.25, dtype="int4").data)
    into = gpuq.Codes(torch.zeros(513, dtype=torch.uint8), (1025,), "int4")
    assert gpuq.quantize(t, 0.25, dtype="int4", out=into) is into
    assert np.array_equal(into.data.numpy(), c.data.numpy())
    assert np.array_equal(gpuq.dequantize(into, 0.25).numpy(), gpuq.dequantize(gpuq.quantize(x, 0.25, dtype="int4"), 0.25))


# -- real torch, CPU tensors: the stand-in's cases (the test extra installs torch) ---------------

def _torch_bits(t):
    """A CPU torch tensor's dtype, shape and raw bytes (fp8 and bfloat16 included)."""
    torch = sys.modules["torch"]
    c = t.detach().contiguous()
    return str(c.dtype), tuple(c.shape), c.reshape(-1).view(torch.uint8).numpy().tobytes()


def test_cpu_torch_parameters_are_read_as_detached():
    torch = pytest.importorskip("torch")
    x = _x(33)
    w = torch.nn.Parameter(torch.from_numpy(x.copy()))
    before = _torch_bits(w)
    s, z = gpuq.choose_qparams(w, dtype="uint8")
    q, s2, z2 = gpuq.quantize_dynamic(w, dtype="uint8")
    r = gpuq.Quantize(scales=[0.5], dtype="u8")(w)
    for got, want in zip((s, z, q, s2, z2, r), (*gpuq.choose_qparams(x, dtype="uint8"),
                                                *gpuq.quantize_dynamic(x, dtype="uint8"),
                                                gpuq.Quantize(scales=[0.5], dtype="u8")(x))):
        assert isinstance(got, torch.Tensor) and not got.requires_grad
        assert np.array_equal(got.numpy(), want) and got.dtype == torch.from_numpy(want).dtype
    assert _torch_bits(w) == before and w.grad is None and w.requires_grad


def test_cpu_torch_parameters_as_scales_and_out():
    torch = pytest.importorskip("torch")
    x = _x(33)
    s = torch.nn.Parameter(torch.tensor([0.25]))
    q = gpuq.quantize(torch.from_numpy(x), s)
    out = torch.nn.Parameter(torch.zeros(33))
    assert gpuq.dequantize(q, s, out=out) is out  # written in place, through a detached view
    assert np.array_equal(q.numpy(), gpuq.quantize(x, 0.25))
    assert np.array_equal(out.detach().numpy().view(np.uint32),
                          gpuq.dequantize(gpuq.quantize(x, 0.25), 0.25).view(np.uint32))
    assert s.grad is None and out.grad is None


@pytest.mark.parametrize("view", ["step", "transpose", "offset", "channels_last"])
def test_cpu_torch_non_contiguous_views(view):
    torch = pytest.importorskip("torch")
    base = torch.from_numpy((np.random.default_rng(7).standard_normal((4, 6, 10, 8)) * 30).astype(np.float32))
    t = {"step": base[:, ::2, :, 1::3], "transpose": base[0].transpose(0, 2),
         "offset": base[1:, 2:, 3:, 4:], "channels_last": base.contiguous(memory_format=torch.channels_last)}[view]
    assert not t.is_contiguous()
    before = _torch_bits(base)
    h = t.numpy()  # the same view of the same memory: what gpuq reads, zero copy
    s = np.linspace(0.1, 1, t.shape[1], dtype=np.float32)
    q = gpuq.quantize(t, s, axis=1)
    assert np.array_equal(q.numpy(), gpuq.quantize(h, s, axis=1))
    y = gpuq.dequantize(q, s, axis=1, dtype="bfloat16")
    assert _torch_bits(y)[2] == gpuq.dequantize(gpuq.quantize(h, s, axis=1), s, axis=1, dtype="bfloat16").tobytes()
    # out= a strided torch view: written where it points, nothing else.
    whole = torch.zeros(t.shape[0], 2 * t.shape[1], *t.shape[2:], dtype=torch.int8)
    out = whole[:, ::2]
    assert gpuq.quantize(t, s, axis=1, out=out) is out
    assert np.array_equal(out.numpy(), q.numpy()) and not whole[:, 1::2].any()
    assert _torch_bits(base) == before


def test_cpu_torch_fp8_out_and_strided_fp8_in():
    torch = pytest.importorskip("torch")
    x = _x(40).reshape(4, 10)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        out = torch.empty(4, 10, dtype=getattr(torch, name))
        assert gpuq.quantize(torch.from_numpy(x), 0.25, out=out) is out  # the code dtype from out
        want = gpuq.quantize(x, 0.25, dtype=name)
        assert np.array_equal(out.view(torch.uint8).numpy(), want.view(np.uint8))
        y = gpuq.dequantize(out[:, ::3], 0.25, dtype="float16")  # fp8 codes read through a strided view
        assert isinstance(y, torch.Tensor) and y.dtype == torch.float16
        assert np.array_equal(y.numpy(), gpuq.dequantize(want[:, ::3], 0.25, dtype="float16"))
