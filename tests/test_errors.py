"""Bad input raises before any work, with the argument, the expected and the received value."""

from __future__ import annotations

import numpy as np
import pytest

import gpuq

X = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
Q = np.arange(24, dtype=np.int8).reshape(2, 3, 4)


def _raises(backend, exc, match, fn, *args, **kwargs):
    """Same error on every backend: src (first arg) is moved there."""
    args = (backend.put(args[0]),) + args[1:]
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


@pytest.mark.parametrize("fn,src", [(gpuq.quantize, X), (gpuq.dequantize, Q)], ids=["q", "dq"])
class TestParameterShapes:
    def test_per_channel_length(self, backend, fn, src):
        _raises(backend, ValueError, r"scales must have 3 elements for axis=1 of shape \(2, 3, 4\), got 4",
                fn, src, np.ones(4, np.float32), axis=1)

    def test_zps_length(self, backend, fn, src):
        _raises(backend, ValueError, r"zps must have 4 elements for axis=2 .* got 2",
                fn, src, np.ones(4, np.float32), np.zeros(2, np.int32), axis=-1)

    def test_per_tensor_needs_one_element(self, backend, fn, src):
        _raises(backend, ValueError, r"scales must have exactly 1 element .*got shape \(2,\)",
                fn, src, [1.0, 2.0])

    def test_multi_axis_shape(self, backend, fn, src):
        _raises(backend, ValueError, r"scales must have shape \(2, 4\) for axis=\(0, 2\).*got shape \(4, 2\)",
                fn, src, np.ones((4, 2), np.float32), axis=(2, 0))

    def test_lookalikes_of_a_valid_axis_are_refused_after_it(self, backend, fn, src):
        """Schemes are cached per (shape, axis, group_size): True == 1 and 2.0 == 2 must not hit."""
        s = np.ones(3, np.float32)
        fn(backend.put(src), s, axis=1)
        fn(backend.put(src), np.ones((2, 3, 2), np.float32), axis=2, group_size=2)
        _raises(backend, TypeError, r"axis must be an integer, got True", fn, src, s, axis=True)
        _raises(backend, TypeError, r"axis must be an integer, got True", fn, src, s, axis=(True,))
        _raises(backend, TypeError, r"group_size must be an integer, got 2.0", fn, src,
                np.ones((2, 3, 2), np.float32), axis=2, group_size=2.0)

    def test_axis_out_of_range(self, backend, fn, src):
        _raises(backend, ValueError, r"axis must be in \[-3, 2\] for rank 3, got 3", fn, src, [1.0] * 4, axis=3)
        _raises(backend, ValueError, r"axis must be in \[-3, 2\] for rank 3, got -4", fn, src, [1.0] * 4, axis=-4)

    def test_repeated_axis(self, backend, fn, src):
        _raises(backend, ValueError, r"axis must not repeat", fn, src, np.ones((2, 2)), axis=(0, -3))

    def test_non_integer_axis(self, backend, fn, src):
        _raises(backend, TypeError, r"axis must be an integer, got 1.0", fn, src, [1.0] * 3, axis=1.0)

    def test_per_channel_on_0d(self, backend, fn, src):
        _raises(backend, ValueError, r"0-d tensor", fn, src.reshape(-1)[:1].reshape(()), [1.0], axis=0)

    @pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf, -np.inf])
    def test_scales_finite_positive(self, backend, fn, src, bad):
        _raises(backend, ValueError, r"scales must be finite and > 0 in float32, got .* at index \(1,\)",
                fn, src, [1.0, bad, 1.0], axis=1)
        _raises(backend, ValueError, r"scales must be finite and > 0", fn, src, bad)

    def test_scale_that_underflows_float32(self, backend, fn, src):
        _raises(backend, ValueError, r"scales must be finite and > 0 in float32, got 0.0", fn, src, 1e-50)

    def test_integer_scales_array(self, backend, fn, src):
        _raises(backend, TypeError, r"scales must be floating \(float32\), got int32",
                fn, src, np.ones(3, np.int32), axis=1)

    @pytest.mark.parametrize("zps", [0.5, [1.0, 2.0, 3.0], np.zeros(3, np.float32)])
    def test_float_zps(self, backend, fn, src, zps):
        axis = None if np.ndim(zps) == 0 else 1
        scales = 1.0 if axis is None else [1.0] * 3
        _raises(backend, TypeError, r"zps must be integers \(int8, uint8 or int32\), got float",
                fn, src, scales, zps, axis=axis)

    def test_zps_outside_int32(self, backend, fn, src):
        _raises(backend, ValueError, r"zps must fit int32 .*got 2147483648", fn, src, 1.0, 2**31)
        _raises(backend, ValueError, r"zps must fit int32 .*got -2147483649", fn, src, 1.0, [-(2**31) - 1])

    def test_bool_zps(self, backend, fn, src):
        _raises(backend, TypeError, r"zps must be integers .*got bool", fn, src, 1.0, True)

    def test_missing_scales(self, backend, fn, src):
        _raises(backend, TypeError, r"scales is required", fn, src, None)

    def test_group_size_without_axis(self, backend, fn, src):
        _raises(backend, ValueError, r"group_size=2 needs a single integer axis", fn, src, 1.0, group_size=2)

    def test_group_size_not_positive(self, backend, fn, src):
        _raises(backend, ValueError, r"group_size must be a positive integer, got 0", fn, src, 1.0, axis=1,
                group_size=0)


def test_integer_src_to_quantize(backend):
    _raises(backend, TypeError, r"src must be float16, float32, float64 or bfloat16 to quantize, got int8",
            gpuq.quantize, Q, 1.0)


def test_float_src_to_dequantize(backend):
    _raises(backend, TypeError, r"src must be int8 or uint8 codes, an fp8 array or gpuq.Codes to dequantize, got float32",
            gpuq.dequantize, X, 1.0)


def test_unknown_dtype_names(backend):
    _raises(backend, ValueError, r"dtype must be one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, got unknown name 'int3'",
            gpuq.quantize, X, 1.0, dtype="int3")
    _raises(backend, ValueError, r"dtype must be one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, got int32", gpuq.quantize, X, 1.0,
            dtype="s32")
    _raises(backend, TypeError, r"dtype must be one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, got int16", gpuq.quantize, X, 1.0,
            dtype=np.int16)
    _raises(backend, ValueError,
            r"dtype must be one of float16, float32, float64, bfloat16, got unknown name 'bf8'",
            gpuq.dequantize, Q, 1.0, dtype="bf8")
    # bfloat16 is a float name, not a code name (refused before ml_dtypes would be imported)
    _raises(backend, ValueError, r"dtype must be one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, got 'bf16'", gpuq.quantize, X, 1.0,
            dtype="bf16")


def test_out_wrong_shape_and_dtype(backend):
    out = backend.put(np.empty((2, 3, 5), np.int8))
    _raises(backend, ValueError, r"out must have shape \(2, 3, 4\) \(the shape of src\), got \(2, 3, 5\)",
            gpuq.quantize, X, 1.0, out=out)
    out = backend.put(np.empty((2, 3, 4), np.int8))
    _raises(backend, TypeError, r"out must have dtype uint8, got int8", gpuq.quantize, X, 1.0, dtype="u8",
            out=out)
    out = backend.put(np.empty((2, 3, 4), np.float64))
    _raises(backend, TypeError, r"out must have dtype float32, got float64", gpuq.dequantize, Q, 1.0,
            dtype="f32", out=out)


def test_out_of_the_wrong_kind_of_array():
    with pytest.raises(TypeError, match=r"out must be a NumPy array for a NumPy src, got list"):
        gpuq.quantize(X, 1.0, out=[0] * 24)


def test_read_only_and_overlapping_out():
    out = np.empty(X.shape, np.int8)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"out must be writeable"):
        gpuq.quantize(X, 1.0, out=out)
    buf = np.zeros(24, np.float32)
    src = buf.view(np.int8)[:24]
    with pytest.raises(ValueError, match=r"out must not overlap src"):
        gpuq.dequantize(src, 1.0, out=buf)


def test_lists_and_scalars_become_numpy_as_np_asarray_makes_them():
    """Python floats are float64 (np.asarray's rule): the float64 contract, NumPy results."""
    q = gpuq.quantize([1.0, 2.5, -0.3], 0.1)
    assert type(q) is np.ndarray and q.tolist() == [10, 25, -3]
    with pytest.raises(TypeError, match="src must be int8 or uint8 codes, an fp8 array or gpuq.Codes to dequantize, got int64"):
        gpuq.dequantize([1, -2], 0.5)
    assert gpuq.quantize(2.5, 1.0).tolist() == 2 and gpuq.quantize(2.5, 1.0).shape == ()
    s, z = gpuq.choose_qparams([0.0, 2.55], dtype="uint8")
    assert type(s) is np.ndarray and s.tolist() == np.float32(0.01).tolist() and z.tolist() == 0


def test_unsupported_src_type():
    with pytest.raises(TypeError, match=r"src must be a NumPy array or a CUDA array .*got builtins.dict"):
        gpuq.quantize({"x": 1.0}, 1.0)


class _HostTensorLike:
    """Like a CPU torch tensor: its class has ``__cuda_array_interface__``, which raises for it."""

    dtype = np.dtype(np.float32)

    @property
    def __cuda_array_interface__(self):
        raise AttributeError("not on a CUDA device")


def test_host_object_whose_class_has_the_cuda_interface_is_refused():
    with pytest.raises(TypeError, match=r"src must be a NumPy array or a CUDA array .*got .*_HostTensorLike"):
        gpuq.quantize(_HostTensorLike(), 1.0)


class _FakeCudaArray:
    """An object that claims CUDA memory: the host backend must refuse it, not copy it."""

    __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_device_scales_with_host_src_is_type_error():
    with pytest.raises(TypeError, match=r"scales is a device \(CUDA\) array but src is a host NumPy array"):
        gpuq.quantize(X, _FakeCudaArray(), axis=1)
    with pytest.raises(TypeError, match=r"zps is a device \(CUDA\) array but src is a host NumPy array"):
        gpuq.quantize(X, [1.0, 1.0, 1.0], _FakeCudaArray(), axis=1)


def test_errors_leave_out_untouched():
    out = np.full(X.shape, 5, np.int8)
    with pytest.raises(ValueError):
        gpuq.quantize(X, [1.0, -1.0, 1.0], axis=1, out=out)
    assert (out == 5).all()
