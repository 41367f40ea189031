"""The CuPy stand-in (tests/cudasim/fake/cupy): its strict checks, its stream model, its interop,
and gpuq running on it end to end.

These tests need the stand-in itself, so they run only where it is active:
the module fixture installs it through ``tests/cudasim/install.py`` and skips
when a real CuPy with a device is there (it is then never shadowed). If this
module installed it, it removes it again afterwards, so the rest of the suite
sees the same ``cupy`` as before.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from cudasim import install as cudasim_install

# Kernels for the checks below (compiled for the host by the engine, launched through RawModule).
_SOURCE = r"""
namespace simtest {
__global__ void fill_bytes(unsigned char* p, long long first, long long n, int v) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        p[first + i] = (unsigned char)v;
}
__global__ void scale(float* x, long long n, float s) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        x[i] = x[i] * s;
}
__global__ void axpy(double* y, const double* x, double a, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = y[i] + a * x[i];
}
__global__ void __launch_bounds__(256) flag(int* out, bool on, unsigned int u) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = on ? 1 : 0;
        out[1] = (int)u;
    }
}
}  // namespace simtest
"""
_NAMES = ["simtest::fill_bytes", "simtest::scale", "simtest::axpy", "simtest::flag"]


@pytest.fixture(scope="module")
def cp():
    was = cudasim_install.mode()
    if cudasim_install.install() != "sim":
        pytest.skip("a real CuPy with a device is in use: the stand-in is not active")
    import cupy

    yield cupy
    if was is None:
        cudasim_install.uninstall()


@pytest.fixture(autouse=True)
def _clean(request):
    """Each test starts with empty records and no fault, and leaves no queued work behind."""
    if "cp" not in request.fixturenames:
        yield
        return
    cupy = request.getfixturevalue("cp")
    cupy._sim.clear_fault()
    cupy._sim.clear_records()
    yield
    leftover = cupy._sim.fault(0) or cupy._sim.fault(1)
    cupy._sim.clear_fault()
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        cupy.cuda.Device(i).synchronize()
    cupy._sim.clear_fault()
    assert leftover is None, f"the test left a sticky device fault: {leftover}"


@pytest.fixture(scope="module")
def mod(cp):
    return cp.RawModule(code=_SOURCE, options=("-std=c++17", "-fmad=false"), name_expressions=_NAMES)


def _fill(mod, arr, first, n, v, stream=None, grid=(1,)):
    mod.get_function("simtest::fill_bytes")(grid, (64,), (arr, np.int64(first), np.int64(n), np.int32(v)),
                                           stream=stream)


# --- installation --------------------------------------------------------------------------------

def test_install_twice_is_the_same_stand_in(cp):
    assert cudasim_install.install() == "sim" == cudasim_install.mode()
    import cupy

    assert cupy is cp and "cudasim" in cp.__version__
    assert sys.path.count(cudasim_install.FAKE_DIR) == 1


def test_absent_features_are_attribute_errors(cp):
    for name in ("random", "ElementwiseKernel", "get_default_memory_pool", "sin"):
        with pytest.raises(AttributeError):
            getattr(cp, name)
    with pytest.raises(AttributeError):
        cp.cuda.get_elapsed_time  # noqa: B018  (timing is not modelled)


def test_device_count_and_schedule_from_the_environment(cp):
    code = ("import cupy; print(cupy.cuda.runtime.getDeviceCount(), cupy.cuda.Device(2).compute_capability, "
            "cupy._sim.get_schedule())")
    env = dict(os.environ, GPUQ_SIM_DEVICES="3", GPUQ_SIM_SCHEDULE="interleaved",
               PYTHONPATH=cudasim_install.FAKE_DIR)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "90", "interleaved"]
    assert cp.cuda.runtime.getDeviceCount() == 2  # the default
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="invalid device ordinal"):
        cp.cuda.Device(2).use()


# --- memory: guards, pointers, argument checks ---------------------------------------------------

def test_allocations_are_aligned_poisoned_and_kept_alive_by_views(cp):
    a = cp.empty(5, cp.float32)
    assert a.data.ptr % 256 == 0
    assert np.isnan(a.get()).all()  # memory nobody wrote reads as NaN (0xFF bytes)
    view = a[1:]
    ptr = a.data.ptr
    del a
    assert view.data.ptr == ptr + 4 and cp._sim.live_allocations() >= 1
    view.fill(2.0)
    assert view.get().tolist() == [2.0] * 4


@pytest.mark.parametrize("first, n, where", [(0, 11, "after"), (-1, 1, "before"), (10, 4, "after")])
def test_guard_bytes_catch_an_out_of_bounds_write(cp, mod, first, n, where):
    a = cp.zeros(10, cp.uint8)
    _fill(mod, a, first, n, 7)  # issued without error: the write happens when the queue runs
    with pytest.raises(cp._sim.OutOfBoundsWrite, match=f"{where} it changed") as err:
        a.get()
    assert "simtest::fill_bytes" in str(err.value)
    # CUDA's sticky error: the device refuses everything until the fault is cleared.
    with pytest.raises(cp._sim.DeviceFaulted):
        cp.zeros(1)
    assert isinstance(cp._sim.clear_fault(), cp._sim.OutOfBoundsWrite)
    _fill(mod, a, 0, 10, 3)
    assert a.get().tolist() == [3] * 10  # the guards were restored: no second report


def test_a_kernel_fault_surfaces_at_the_synchronisation_and_sticks(cp, mod):
    scale = mod.get_function("simtest::scale")
    scale((1,), (32,), (np.uint64(0), np.int64(4), np.float32(2)))  # NULL is a valid argument...
    assert cp._sim.pending() == 1  # ...and the launch call itself reports nothing
    with pytest.raises(cp._sim.KernelFault, match="simtest::scale.*illegal memory access"):
        cp.cuda.Device().synchronize()
    with pytest.raises(cp._sim.DeviceFaulted, match="sticky"):
        cp.cuda.Stream.null.synchronize()
    with cp.cuda.Device(1):
        assert cp.ones(1).get().tolist() == [1.0]  # another device is unaffected
    assert isinstance(cp._sim.clear_fault(), cp._sim.KernelFault)


def test_an_integer_pointer_does_not_keep_its_allocation_alive(cp, mod):
    a = cp.zeros(4, cp.float32)
    cp.cuda.Device().synchronize()
    ptr = np.uint64(a.data.ptr)
    mod.get_function("simtest::scale")((1,), (32,), (ptr, np.int64(4), np.float32(2)))  # a is alive here
    del a  # the last reference: the memory goes back before the queued launch runs
    with pytest.raises(cp._sim.AsyncFault, match="freed before the launch ran"):
        cp.cuda.Device().synchronize()
    cp._sim.clear_fault()


def test_in_bounds_write_passes_the_guard_check(cp, mod):
    a = cp.zeros(10, cp.uint8)
    _fill(mod, a[2:], 0, 8, 9)
    assert a.get().tolist() == [0, 0] + [9] * 8


def test_pointer_on_another_device_is_refused(cp, mod):
    with cp.cuda.Device(1):
        b = cp.zeros(4, cp.uint8)
    with pytest.raises(cp._sim.PointerError, match="argument 0 .*device 1, launch on device 0"):
        _fill(mod, b, 0, 4, 1)
    with cp.cuda.Device(1):
        _fill(mod, b, 0, 4, 1)  # fine where it lives
        assert b.get().tolist() == [1] * 4
    # A raw integer pointer: NULL is allowed, an address outside every allocation is not.
    fn = mod.get_function("simtest::fill_bytes")
    fn((1,), (64,), (np.uint64(0), np.int64(0), np.int64(0), np.int32(0)))
    with pytest.raises(cp._sim.PointerError, match="argument 0 .*not in any live device allocation"):
        fn((1,), (64,), (np.uint64(4096), np.int64(0), np.int64(0), np.int32(0)))
    with cp.cuda.Device(1):
        raw = np.uint64(b.data.ptr)
    with pytest.raises(cp._sim.PointerError, match="on device 1, launch on device 0"):
        fn((1,), (64,), (raw, np.int64(0), np.int64(0), np.int32(0)))
    assert [r.device_id for r in cp._sim.launches] == [1, 0]


def test_argument_sizes_and_kinds_are_checked(cp, mod):
    a = cp.zeros(4, cp.uint8)
    fill = mod.get_function("simtest::fill_bytes")
    bad = cp._sim.LaunchArgumentError
    with pytest.raises(bad, match=r"argument 1 \(long long\): got np.int32, 4 bytes"):
        fill((1,), (64,), (a, np.int32(0), np.int64(4), np.int32(1)))
    with pytest.raises(bad, match=r"argument 3 \(int\): got int \(as int64\), 8 bytes"):
        fill((1,), (64,), (a, 0, 4, 1))  # a Python int is an 8-byte long long, as in CuPy
    with pytest.raises(bad, match="takes 4 arguments"):
        fill((1,), (64,), (a, np.int64(0), np.int64(4)))
    with pytest.raises(bad, match="an integer parameter got np.float64"):
        fill((1,), (64,), (a, np.float64(0), np.int64(4), np.int32(1)))
    with pytest.raises(bad, match="a pointer parameter needs"):
        fill((1,), (64,), (np.float64(0), np.int64(0), np.int64(4), np.int32(1)))
    fill((1,), (64,), (a, 0, 4, np.int32(1)))  # Python ints where the kernel takes long long: fine
    scale = mod.get_function("simtest::scale")
    x = cp.ones(3, cp.float32)
    with pytest.raises(bad, match=r"argument 2 \(float\): got float \(as float64\), 8 bytes"):
        scale((1,), (64,), (x, 3, 2.0))  # a Python float is a double
    with pytest.raises(bad, match="a floating-point parameter got np.int32"):
        scale((1,), (64,), (x, 3, np.int32(2)))
    scale((1,), (64,), (x, 3, np.float32(2)))
    axpy = mod.get_function("simtest::axpy")
    y, z = cp.ones(3, cp.float64), cp.arange(3, dtype=cp.float64)
    axpy((1,), (64,), (y, z, 0.5, 3))  # Python float -> double, Python int -> long long
    flag = mod.get_function("simtest::flag")
    out = cp.zeros(2, cp.int32)
    with pytest.raises(bad, match="a bool parameter got np.int8"):
        flag((1,), (32,), (out, np.int8(1), np.uint32(5)))
    with pytest.raises(bad, match=r"value -1 changes when read as unsigned int"):
        flag((1,), (32,), (out, True, np.int32(-1)))
    flag((1,), (32,), (out, True, np.int32(5)))  # a signed value that survives as unsigned
    with pytest.raises(TypeError, match="Unsupported type"):
        flag((1,), (32,), (out, "yes", np.uint32(5)))
    with pytest.raises(TypeError, match="numpy.ndarray of shape"):
        flag((1,), (32,), (np.zeros(2, np.int32), True, np.uint32(5)))
    with pytest.raises(TypeError, match="expected tuple"):
        flag([1], (32,), (out, True, np.uint32(5)))
    with pytest.raises(cp._sim.LaunchConfigError, match="OUT_OF_RESOURCES"):
        flag((1,), (512,), (out, True, np.uint32(5)))  # beyond the kernel's max threads
    assert x.get().tolist() == [2.0] * 3 and y.get().tolist() == [1.0, 1.5, 2.0]
    assert out.get().tolist() == [1, 5]


def test_launch_record_contents(cp, mod):
    with cp.cuda.Device(1):
        a = cp.zeros(8, cp.uint8)
        s = cp.cuda.Stream(non_blocking=True)
        cp.cuda.Device().synchronize()
        with cp._sim.schedule("reversed"):
            _fill(mod, a, 0, 8, 5, stream=s, grid=(0,))
        rec = cp._sim.launches[-1]
        assert cp._sim.get_schedule() == "inorder"
        s.synchronize()
    assert (rec.name, rec.grid, rec.block, rec.shared_mem) == ("simtest::fill_bytes", (1, 1, 1), (64, 1, 1), 0)
    assert (rec.stream_ptr, rec.device_id, rec.schedule) == (s.ptr, 1, "reversed")
    assert rec.args == (a.data.ptr, 0, 8, 5) and rec.options == ("-std=c++17", "-fmad=false")
    assert a.get().tolist() == [5] * 8
    with pytest.raises(ValueError, match="unknown schedule"):
        cp._sim.set_schedule("random")


def test_the_schedule_in_force_at_issue_reaches_the_engine(cp, mod):
    fn = mod.get_function("simtest::scale")
    seen = []

    class Spy:
        def __init__(self, k):
            self._k, self.params, self.max_threads = k, k.params, k.max_threads

        def launch(self, **kw):
            seen.append(kw["schedule"])
            return self._k.launch(**kw)

    fn._kernel = Spy(fn._kernel)
    x = cp.ones(4, cp.float32)
    for name in cp._sim.SCHEDULES:
        with cp._sim.schedule(name):
            fn((1,), (32,), (x, np.int64(4), np.float32(2)))
    x.get()  # everything runs here, after the blocks
    assert seen == list(cp._sim.SCHEDULES)


def test_sanitize_switch_reaches_the_engine(cp, monkeypatch):
    from cudasim import hostbuild

    seen = []

    def spy(source, names, *, sanitize=False, defines=()):
        seen.append((tuple(names), sanitize))
        raise hostbuild.BuildError("spy: nothing built")

    monkeypatch.setattr(hostbuild, "build", spy)
    for flag in ("1", "0"):
        monkeypatch.setenv("GPUQ_SIM_SANITIZE", flag)
        m = cp.RawModule(code=_SOURCE, name_expressions=_NAMES[:2])
        with pytest.raises(hostbuild.BuildError, match="spy"):
            m.get_function(_NAMES[1])  # compiled at the first get_function, like CuPy
    assert seen == [(tuple(_NAMES[:2]), True), (tuple(_NAMES[:2]), False)]


def test_module_records_keep_the_compile_options(cp):
    cp.RawModule(code=_SOURCE, options=("-std=c++17", "-ftz=false"), name_expressions=_NAMES[:1])
    rec = cp._sim.modules[-1]
    assert rec.options == ("-std=c++17", "-ftz=false") and rec.name_expressions == tuple(_NAMES[:1])
    with pytest.raises(TypeError, match="expected tuple"):
        cp.RawModule(code=_SOURCE, options=["-std=c++17"])


# --- streams, events, synchronisation ------------------------------------------------------------

def test_work_runs_only_at_synchronisation_points(cp):
    a = cp.arange(4, dtype=cp.float32)
    b = a * 2 + 1
    assert cp._sim.pending() == 3 and cp._sim.syncs == []
    assert cp.asnumpy(b).tolist() == [1.0, 3.0, 5.0, 7.0]
    assert cp._sim.pending() == 0
    assert cp._sim.syncs == [cp._sim.SyncRecord("asnumpy", 0, 1)]


def test_host_reads_are_recorded_synchronisations(cp):
    a = cp.asarray([3], cp.int32)
    assert bool(a) and int(a) == 3 and float(a) == 3.0 and a.item() == 3
    assert [r.what for r in cp._sim.syncs] == ["ndarray.__bool__", "ndarray.__int__", "ndarray.__float__",
                                               "ndarray.item"]
    cp._sim.syncs.clear()
    assert cp.empty(0).get().shape == (0,) and cp._sim.syncs == []  # CuPy: no copy, no sync
    with pytest.raises(ValueError, match="ambiguous"):
        bool(cp.zeros(2))


def test_a_read_without_synchronisation_sees_old_data(cp):
    a = cp.zeros(4, cp.float32)
    cp.cuda.Device().synchronize()
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with s1:
        a.fill(5)
    with s2:
        assert a.get().tolist() == [0.0] * 4  # s2 does not wait for s1: the stale value
    with s1:
        a.fill(7)
    s2.wait_event(s1.record())
    with s2:
        assert a.get().tolist() == [7.0] * 4  # the event orders s1's writes before s2's read


def test_legacy_stream_waits_for_blocking_streams_only(cp):
    a, b = cp.zeros(2, cp.int32), cp.zeros(2, cp.int32)
    cp.cuda.Device().synchronize()
    with cp.cuda.Stream():  # blocking: the legacy stream waits for it
        a.fill(1)
    with cp.cuda.Stream(non_blocking=True) as nb:
        b.fill(1)
    assert a.get().tolist() == [1, 1]
    assert b.get().tolist() == [0, 0]
    nb.synchronize()
    assert b.get().tolist() == [1, 1]
    # And a blocking stream waits for work queued before on the legacy stream.
    c = cp.zeros(2, cp.int32)
    c.fill(4)
    with cp.cuda.Stream() as s:
        d = c + 1
    s.synchronize()
    assert cp._sim.pending() == 0 and d.get().tolist() == [5, 5]


def test_uploads_snapshot_the_host_data(cp):
    host = np.arange(3, dtype=np.float32)
    dev = cp.asarray(host)
    host[:] = -1
    assert dev.get().tolist() == [0.0, 1.0, 2.0]


def test_events(cp):
    e = cp.cuda.Event()
    assert e.done  # never recorded: complete
    a = cp.zeros(3, cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with s:
        a.fill(2)
        e.record()
    assert e.done is False  # not run yet; the query lets the device progress
    assert e.done is True and a.get().tolist() == [2] * 3
    with s:
        a.fill(5)
    assert s.done is False and s.done is True
    e2 = s.record()
    with s:
        a.fill(3)
    e2.synchronize()  # runs s up to e2 only
    assert cp._sim.pending() == 1
    assert [r.what for r in cp._sim.syncs][-1] == "Event.synchronize"
    s.synchronize()
    assert a.get().tolist() == [3] * 3
    with cp.cuda.Device(1):
        s1 = cp.cuda.Stream()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="InvalidResourceHandle"):
        e.record(s1)
    with pytest.raises(RuntimeError, match="does not match with the current device"), s1:
        pass


def test_streams_and_devices_are_per_context(cp, mod):
    assert cp.cuda.get_current_stream() is cp.cuda.Stream.null
    s = cp.cuda.Stream()
    with s:
        assert cp.cuda.get_current_stream() is s
        with cp.cuda.Device(1):
            assert cp.cuda.get_current_stream() is cp.cuda.Stream.null
            x = cp.zeros(2, cp.uint8)
            with pytest.raises(cp._sim.LaunchConfigError, match="stream of device 0"):
                _fill(mod, x, 0, 2, 1, stream=s)
        assert cp.cuda.ExternalStream(s.ptr) == s
    assert cp.cuda.get_current_stream() is cp.cuda.Stream.null
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="not a live stream"):
        cp.cuda.ExternalStream(0x1234)


def test_elementwise_work_refuses_another_device(cp):
    with cp.cuda.Device(1):
        x = cp.ones(3)
    with pytest.raises(ValueError, match="Peer access is unavailable"):
        x + 1
    y = x.copy()  # CuPy copies across devices onto the current one...
    assert y.device.id == 0 and np.isnan(y.get()).all()  # ...without waiting for device 1's stream
    cp.cuda.Device(1).synchronize()
    assert x.copy().get().tolist() == [1.0] * 3
    with pytest.raises(NotImplementedError, match="non-contiguous"):
        x[::2].copy()


# --- arrays: views, operators, NumPy refusal -----------------------------------------------------

def test_views_share_memory(cp):
    a = cp.arange(12, dtype=cp.int32)
    b = a.reshape(3, 4)
    c = b.T
    d = b[1, 1:3]
    e = a.view(cp.uint8)
    assert b.data.ptr == c.data.ptr == e.data.ptr == a.data.ptr and d.data.ptr == a.data.ptr + 20
    assert c.strides == (4, 16) and not c.flags.c_contiguous and c.flags.f_contiguous
    d[...] = -1
    b[2] = 100
    assert a.get().tolist() == [0, 1, 2, 3, 4, -1, -1, 7, 100, 100, 100, 100]
    assert e.shape == (48,) and cp.may_share_memory(d, a) and not cp.may_share_memory(b[0], b[1])
    assert b[0, 0].shape == () and int(b[0, 0]) == 0  # an integer index gives a 0-d view
    flat = c.ravel()  # not expressible as a view: a copy
    assert not cp.may_share_memory(flat, a) and flat.get().tolist()[:3] == [0, 4, 100]
    s = cp.broadcast_to(cp.asarray([1.0, 2.0]).reshape(1, 2), (3, 2))
    assert s.strides == (0, 8) and cp.ascontiguousarray(s).get().tolist() == [[1.0, 2.0]] * 3
    assert cp.ascontiguousarray(cp.ones((), cp.int8)).shape == (1,)  # CuPy's 0-d rule
    with pytest.raises(NotImplementedError, match="basic indexing"):
        a[cp.asarray([1, 2])]


def test_operators_follow_numpy_promotion_and_refuse_numpy_arrays(cp):
    a = cp.asarray([1, 2, 3], cp.int8)
    assert (a + 1).dtype == np.int8 and (a * 1.5).dtype == np.float64 and (a + np.int32(1)).dtype == np.int32
    assert (~((a > 1) & (a < 3))).get().tolist() == [True, False, True]
    with pytest.raises(OverflowError):
        a + 300  # NEP 50 at the call, like NumPy
    m = cp.asarray([[1.0, np.nan], [3.0, -1.0]], cp.float32)
    assert bool((m != m).any())  # noqa: PLR0124  (NaN)
    assert int(m.ravel().argmax()) == 1 and float(m[1].min()) == -1.0
    assert float(cp.asarray([1.0, 2.0]).sum()) == 3.0 and not bool(cp.asarray([True, False]).all())
    with pytest.raises(TypeError):
        a + np.ones(3, np.int8)
    with pytest.raises(TypeError):
        np.ones(3) + a
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)
    with pytest.raises(TypeError):
        np.add(a, 1)
    a += 1
    assert a.get().tolist() == [2, 3, 4]


# --- interop: __cuda_array_interface__ and DLPack ------------------------------------------------

class _CAI:
    def __init__(self, desc):
        self.__cuda_array_interface__ = desc


def test_cuda_array_interface_v3_round_trip(cp):
    a = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    desc = a.__cuda_array_interface__
    assert desc["version"] == 3 and desc["stream"] == 1 and desc["strides"] is None
    assert desc["data"] == (a.data.ptr, False) and desc["typestr"] == "<f4" and desc["shape"] == (2, 3)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()  # the upload ran on the legacy stream, which s does not wait for
    with s:
        assert a.__cuda_array_interface__["stream"] == s.ptr
        t = a.T
        desc = t.__cuda_array_interface__
        assert desc["strides"] == (4, 12)
        a.fill(3)  # pending on s
        v = cp.asarray(_CAI(desc))  # CuPy synchronises the producer's stream (s) first
    assert cp._sim.syncs[-1] == cp._sim.SyncRecord("__cuda_array_interface__ import", 0, s.ptr)
    assert v.data.ptr == a.data.ptr and v.strides == (4, 12) and v.get().tolist() == [[3.0] * 2] * 3
    v[0, 0] = 9  # zero copy: writes reach a
    assert float(a[0, 0]) == 9.0
    bad = dict(desc, data=(12345, False))
    with pytest.raises(ValueError, match="not in any live device allocation"):
        cp.asarray(_CAI(bad))
    with pytest.raises(ValueError, match="outside its allocation"):
        cp.asarray(_CAI(dict(desc, shape=(3, 3), strides=None)))


def test_cuda_array_interface_sync_can_be_turned_off(cp, monkeypatch):
    monkeypatch.setenv("CUPY_CUDA_ARRAY_INTERFACE_SYNC", "0")
    a = cp.zeros(2, cp.int32)
    cp._sim.syncs.clear()
    cp.asarray(_CAI(a.__cuda_array_interface__))
    assert cp._sim.syncs == [] and cp._sim.pending() == 1


class _Producer:
    """A DLPack producer that remembers the stream it was asked for."""

    def __init__(self, arr):
        self.arr, self.streams = arr, []

    def __dlpack__(self, *, stream=None, **kw):
        self.streams.append(stream)
        return self.arr.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_dlpack_producer_orders_its_stream_before_the_consumers(cp):
    with cp.cuda.Device(1):
        a = cp.zeros(4, cp.int16)
        cp.cuda.Device().synchronize()
        assert a.__dlpack_device__() == (2, 1)
        ps, cs = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
        with ps:
            a.fill(6)  # queued on the producer's current stream
            unordered = a.__dlpack__(stream=-1)  # -1: the consumer asks for no ordering
        with cs:
            assert cp.from_dlpack(unordered).get().tolist() == [0] * 4  # stale: nothing waited
        with ps:
            ordered = a.__dlpack__(stream=cs.ptr)  # cs must wait for ps's work so far
        with cs:
            b = cp.from_dlpack(ordered)
            assert b.get().tolist() == [6] * 4  # no explicit synchronisation needed
        assert b.data.ptr == a.data.ptr and b.device.id == 1
    with pytest.raises(ValueError, match="consumed multiple times"):
        cp.from_dlpack(ordered)
    with pytest.raises(ValueError, match="valid stream for the DLPack protocol"):
        a.__dlpack__(stream=-5)
    with pytest.raises(TypeError, match="CPU arrays cannot be directly imported"):
        cp.from_dlpack(np.ones(3))


def test_from_dlpack_passes_its_current_stream_of_the_producers_device(cp):
    with cp.cuda.Device(1):
        a = cp.arange(4, dtype=cp.int16)
        cs = cp.cuda.Stream()
    p = _Producer(a)
    b = cp.from_dlpack(p)  # device 0 is current; device 1's current stream is the legacy one
    assert p.streams == [1] and cp.cuda.Device().id == 0
    with cp.cuda.Device(1), cs:
        cp.from_dlpack(p)
    assert p.streams == [1, cs.ptr]
    assert b.data.ptr == a.data.ptr and b.get().tolist() == [0, 1, 2, 3]


# --- gpuq on the stand-in ------------------------------------------------------------------------

def test_gpuq_quantize_end_to_end(cp):
    import gpuq

    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1001) * 30).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, 0.25]
    xd = cp.asarray(x)
    cp._sim.syncs.clear()
    q = gpuq.quantize(xd, 0.1)
    assert isinstance(q, cp.ndarray) and cp._sim.syncs == []  # no synchronisation on the call path
    assert [r.name for r in cp._sim.launches][-1].startswith("gpuq::quantize<float, signed char")
    want = gpuq.quantize(x, 0.1)
    assert np.array_equal(cp.asnumpy(q), want)
    y = gpuq.dequantize(q[1:], 0.1, 3, dtype="float16")  # a view one element in: unaligned
    assert np.array_equal(cp.asnumpy(y).view(np.uint16), gpuq.dequantize(want[1:], 0.1, 3, dtype="float16")
                          .view(np.uint16))
    with cp.cuda.Device(1):
        x1 = cp.asarray(x)
    q1 = gpuq.quantize(x1, [0.1], 2, dtype="uint8")
    assert q1.device.id == 1 and cp._sim.launches[-1].device_id == 1
    assert np.array_equal(cp.asnumpy(q1), gpuq.quantize(x, 0.1, 2, dtype="uint8"))


def test_gpuq_choose_qparams_synchronises_once(cp):
    import gpuq

    x = np.linspace(-3, 5, 777, dtype=np.float32)
    cp._sim.syncs.clear()
    s, z = gpuq.choose_qparams(cp.asarray(x), dtype="uint8")
    assert [r.what for r in cp._sim.syncs] == ["ndarray.get"]  # the +/-inf flag, nothing else
    hs, hz = gpuq.choose_qparams(x, dtype="uint8")
    assert np.array_equal(cp.asnumpy(s).view(np.uint32), np.asarray(hs).view(np.uint32))
    assert np.array_equal(cp.asnumpy(z), hz)


_ARCH_SOURCE = 'extern "C" __global__ void arch(int* out) { out[0] = __CUDA_ARCH__; }'


def test_modules_build_for_the_compute_capability_the_devices_report(cp):
    # A module is built with __CUDA_ARCH__ = 10 x the compute capability current when it is made
    # (so sm_89+ paths run by default and sm_80 paths on request), as NVRTC builds for one -arch.
    def built_arch():
        out = cp.zeros(1, np.int32)
        cp.RawKernel(_ARCH_SOURCE, "arch")((1,), (1,), (out,))
        return int(out.get()[0]), cp.cuda.Device().compute_capability

    default = cp._sim.COMPUTE_CAPABILITY
    assert built_arch() == (int(default) * 10, default)
    with cp._sim.compute_capability("80"):
        assert built_arch() == (800, "80")
        assert cp.cuda.runtime.getDeviceProperties(0)["major"] == 8
    assert built_arch() == (int(default) * 10, default)
    with pytest.raises(ValueError, match="compute capability"):
        cp._sim.set_compute_capability("sm_90")
