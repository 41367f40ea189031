"""Op objects faithful to the oneDNN Graph specs (../shared/spec/).

Attributes are given and validated at construction; inputs come in the
specs' index order at call. Each op calls :func:`gpuq.quantize` or
:func:`gpuq.dequantize`; the static ops keep their scales/zps on the host
and, for device inputs, upload them once per device and dtype (one value,
per-tensor, stays on the host: the kernel takes it by value).
"""

from __future__ import annotations

import weakref

import numpy as np

from ._dispatch import backend_for, host_base, source_codes
from ._interop import callers_type, is_dask_array
from ._codes import Codes
from ._codetypes import CODE_TYPES, as_code_type
from ._dtypes import FLOAT_DTYPES, as_dtype, compute_dtype, native
from ._params import check_saturate, scales_param, zps_param
from ._scheme import Scheme
from .api import dequantize, quantize

__all__ = ["Quantize", "Dequantize", "DynamicQuantize", "DynamicDequantize"]

_QTYPES = ("per_tensor", "per_channel")


def _check_qtype(qtype, axis):
    if qtype not in _QTYPES:
        raise ValueError(f"qtype must be one of {', '.join(_QTYPES)}, got {qtype!r}")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    return None if qtype == "per_tensor" else int(axis)


class _Static:
    """Static scales/zps checked once at construction, uploaded once per device (except one value).

    Scales follow the rule of :func:`gpuq.quantize`: they are kept as given and
    used in the compute type of each call (float32; float64 with float64 src for
    Quantize, with float64 output for Dequantize), so a float64 scale of 0.1
    stays 0.1 for float64 data and an op gives the bits of the functional call.
    Construction checks them in ``ct`` (Dequantize: its output's compute type;
    Quantize: float64, as src may be float64): a scale that only float64 holds
    (1e-50, 1e39) is refused at a call with float32 compute, with the
    functional API's ``ValueError``.
    """

    def __init__(self, scales, zps, qtype, axis, ct):
        self.qtype, self.axis = qtype, axis
        self._axis = _check_qtype(qtype, axis)
        s = np.asarray(scales)
        if s.ndim != 1:
            raise ValueError(f"scales must be a 1-D list, got shape {s.shape}")
        if qtype == "per_tensor" and s.size != 1:
            raise ValueError(f"scales must have exactly 1 element for qtype='per_tensor', got {s.size}")
        # Checked against a stand-in scheme whose shape fits; the call checks the real shape.
        self._stand_in = Scheme.build((s.size,), None if self._axis is None else 0)
        self._host = backend_for(np.empty(0))[0]  # the values are checked on the host, now
        scales_param(scales, self._stand_in, ct, self._host)
        # Copies, as given (a base ndarray): the op must not follow later changes to the
        # caller's arrays, and each compute type rounds the given values once.
        self._scales = np.array(scales)
        self._by_ct = {}
        self._zps = None
        if zps is not None:
            z = np.asarray(zps)
            if z.shape != s.shape:
                raise ValueError(f"zps must have {s.size} elements like scales, got shape {z.shape}")
            # Shape and int32 range here; a code type without zero points checks them at use.
            self._zps = zps_param(zps, CODE_TYPES["int8"], self._stand_in, self._host).copy()
        self._device_params = {}  # (device, compute type) -> ((scales, zps), StreamReaders)
        # The uploads stay alive until the streams that read them have passed (StreamReaders).
        weakref.finalize(self, _release_uploads, self._device_params)

    def _scales_in(self, ct):
        """The scales in compute type ``ct``, checked there (once per ct), 1-D."""
        scales = self._by_ct.get(ct)
        if scales is None:
            scales = scales_param(self._scales, self._stand_in, ct, self._host).reshape(-1)
            self._by_ct[ct] = scales
        return scales

    def _params(self, src, ct, code):
        """``((scales, zps), readers)``: the parameters for ``src``'s device in compute type
        ``ct``, and what to tell after the call (``readers.note_read()``). Zero points are None
        where ``code``'s row has none (checked zeros at construction or here)."""
        backend, arr = backend_for(src.data if isinstance(src, Codes) else src)
        scales = self._scales_in(ct)
        has_zps = self._zps is not None and code.zero_point != "none"
        if self._zps is not None and not has_zps:
            zps_param(self._zps, code, self._stand_in, self._host)  # zeros only: ValueError else
        key = (backend.device_key(arr), ct, has_zps)
        if key not in self._device_params:
            params = (
                backend.to_param(scales, arr),
                backend.to_param(self._zps.reshape(-1), arr) if has_zps else None,
            )
            # Uploaded once, reused from any stream: the first use waits for the upload,
            # later ones neither wait nor synchronise (CUDA graph capture stays possible).
            backend.settle()
            self._device_params[key] = (params, backend.track_reads(params))
        return self._device_params[key]

    def _reshaped(self, params):
        # per_tensor takes one element of any shape; per-channel a 1-D list.
        scales, zps = params
        if self._axis is None:
            return scales.reshape(()), None if zps is None else zps.reshape(())
        return params

    def _on_dask(self, src, *, out=None):
        """A Dask ``src`` (``gpuq._dask``): the functional call with the host parameters,
        which that call checks and lines up with the chunks."""
        scales, zps = self._reshaped((self._scales, self._zps))
        return self._function(src, scales, zps, axis=self._axis, dtype=self.dtype, out=out, **self._extra)


def _release_uploads(device_params) -> None:
    for _params, readers in device_params.values():
        readers.release()


class Quantize(_Static):
    """oneDNN Graph Quantize: static scales/zps attributes, input ``src``.

    Scales are used as :func:`gpuq.quantize` uses them: float32 (the spec's
    f32), float64 for float64 ``src`` (a float64 scale then keeps every bit).

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> q = gpuq.Quantize(scales=[0.5], zps=[10], dtype="u8")
    >>> q(np.array([1.0, -1.0, 200.0], np.float32))
    array([ 12,   8, 255], dtype=uint8)
    """

    _function = staticmethod(quantize)

    def __init__(self, scales, zps=None, qtype="per_tensor", axis=1, dtype="int8", saturate=True):
        super().__init__(scales, zps, qtype, axis, np.dtype(np.float64))
        self.dtype, self.saturate = _code_attrs(dtype, saturate)
        self._extra = dict(saturate=self.saturate)
        self._code = as_code_type(self.dtype)
        if self._zps is not None:
            zps_param(self._zps, self._code, self._stand_in, self._host)  # fp8: zeros only, now

    @callers_type(arg=1)
    def __call__(self, src, *, out=None):
        arr = backend_for(src)[1]
        dt = native(arr.dtype)
        kw = dict(axis=self._axis, dtype=self.dtype, out=out, saturate=self.saturate)
        if dt not in FLOAT_DTYPES:  # quantize() raises its TypeError for src first
            return quantize(src, self._scales, **kw)
        params, readers = self._params(arr, compute_dtype(dt), self._code)
        scales, zps = self._reshaped(params)
        result = quantize(src, scales, zps, check_values=False, **kw)
        if readers is not None:
            readers.note_read()
        return result


def _code_attrs(dtype, saturate):
    """The code dtype attribute (NumPy's int8/uint8 dtype, or the name of int4/uint4/fp8) and
    ``saturate``, checked as :func:`gpuq.quantize` checks them."""
    code = as_code_type(dtype)
    check_saturate(saturate, code)
    return code.dtype_attribute, bool(saturate)


class Dequantize(_Static):
    """oneDNN Graph Dequantize: static scales/zps attributes, input ``src``.

    ``dtype`` (float32 by default, the spec's; float16/float64/bfloat16 as nGraph's ``type``).
    Scales are used as :func:`gpuq.dequantize` uses them: float32, float64 for
    float64 output (``Dequantize(scales=[0.1], dtype="f64")`` multiplies by 0.1,
    not by float32(0.1)).

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> d = gpuq.Dequantize(scales=[2.0, 0.5], zps=[0, 4], qtype="per_channel", axis=0)
    >>> d(np.array([[1, 2], [4, 6]], np.int8))
    array([[2., 4.],
           [0., 1.]], dtype=float32)
    """

    _function = staticmethod(dequantize)
    _extra = {}

    def __init__(self, scales, zps=None, qtype="per_tensor", axis=1, dtype="float32"):
        self.dtype = as_dtype(dtype, "dtype", FLOAT_DTYPES)
        super().__init__(scales, zps, qtype, axis, compute_dtype(self.dtype))

    @callers_type(arg=1)
    def __call__(self, src, *, out=None):
        code = source_codes(src)[1]
        params, readers = self._params(src, compute_dtype(self.dtype), code)
        scales, zps = self._reshaped(params)
        result = dequantize(src, scales, zps, axis=self._axis, dtype=self.dtype, out=out,
                            check_values=False)
        if readers is not None:
            readers.note_read()
        return result


class DynamicQuantize:
    """oneDNN Graph DynamicQuantize: inputs ``(src, scales, zps=None)``.

    ``qtype="per_group"`` with ``group_shape`` (one entry per dim of src: gpuq's
    ``block_size``, the last block along a dim may be shorter) takes scales/zps of shape
    ``ceil(src.shape / group_shape)``.

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> op = gpuq.DynamicQuantize(qtype="per_channel", axis=0)
    >>> op(np.array([[2.5, 3.5], [1.0, -8.0]], np.float32), np.array([1.0, 2.0], np.float32))
    array([[ 2,  4],
           [ 0, -4]], dtype=int8)
    >>> op = gpuq.DynamicQuantize(qtype="per_group", group_shape=[1, 2])
    >>> op(np.array([[2.5, 3.5, 1.0, -8.0]], np.float32), np.array([[1.0, 2.0]], np.float32))
    array([[ 2,  4,  0, -4]], dtype=int8)
    """

    def __init__(self, qtype="per_tensor", axis=1, dtype="int8", group_shape=None, saturate=True):
        self.qtype, self.axis, self.group_shape = qtype, axis, group_shape
        self._axis, self._group = _check_dynamic_qtype(qtype, axis, group_shape)
        self.dtype, self.saturate = _code_attrs(dtype, saturate)

    @callers_type(arg=1)
    def __call__(self, src, scales, zps=None, *, out=None):
        kw = dict(dtype=self.dtype, out=out, saturate=self.saturate)
        if self._group is not None:
            return _per_group(quantize, self._group, src, scales, zps, **kw)
        return quantize(src, scales, zps, axis=self._axis, **kw)

    # A Dask src (gpuq._dask): the same body, whose functions take Dask arrays.
    _on_dask = __call__.__wrapped__


class DynamicDequantize:
    """oneDNN Graph DynamicDequantize: inputs ``(src, scales, zps=None)``.

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> op = gpuq.DynamicDequantize()
    >>> op(np.array([0, 3, 255], np.uint8), np.array([2.0], np.float32), np.array([128], np.int32))
    array([-256., -250.,  254.], dtype=float32)
    >>> op = gpuq.DynamicDequantize(qtype="per_group", group_shape=[2, 1])
    >>> op(np.array([[1, 2], [3, 4]], np.int8), np.array([[0.5, 2.0]], np.float32))
    array([[0.5, 4. ],
           [1.5, 8. ]], dtype=float32)
    """

    def __init__(self, qtype="per_tensor", axis=1, dtype="float32", group_shape=None):
        self.qtype, self.axis, self.group_shape = qtype, axis, group_shape
        self._axis, self._group = _check_dynamic_qtype(qtype, axis, group_shape)
        self.dtype = as_dtype(dtype, "dtype", FLOAT_DTYPES)

    @callers_type(arg=1)
    def __call__(self, src, scales, zps=None, *, out=None):
        if self._group is not None:
            return _per_group(dequantize, self._group, src, scales, zps, dtype=self.dtype, out=out)
        return dequantize(src, scales, zps, axis=self._axis, dtype=self.dtype, out=out)

    # A Dask src (gpuq._dask): the same body, whose functions take Dask arrays.
    _on_dask = __call__.__wrapped__


def _check_dynamic_qtype(qtype, axis, group_shape):
    """``(axis, group_shape)`` of a dynamic op: per_group gives ``(None, tuple)``."""
    if qtype != "per_group":
        if qtype not in _QTYPES:
            raise ValueError(f"qtype must be one of {', '.join(_QTYPES)}, per_group, got {qtype!r}")
        if group_shape is not None:
            raise ValueError(
                f"group_shape is only used with qtype='per_group', got group_shape={group_shape!r} "
                f"with qtype={qtype!r}"
            )
        return _check_qtype(qtype, axis), None
    if not isinstance(group_shape, (list, tuple)):
        raise TypeError(f"group_shape must be a list of positive integers for qtype='per_group', "
                        f"got {group_shape!r}")
    for g in group_shape:
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
            raise TypeError(f"group_shape must be a list of positive integers, got {list(group_shape)!r}")
        if g < 1:
            raise ValueError(f"group_shape must be a list of positive integers, got {list(group_shape)!r}")
    return None, tuple(int(g) for g in group_shape)


def _per_group(fn, group_shape, src, scales, zps, **kwargs):
    """oneDNN per_group as gpuq's block scales: ``group_shape`` is ``block_size`` (one entry per
    dim of src; the last block along a dim may be shorter), scales/zps of shape
    ``ceil(src.shape / group_shape)``."""
    if isinstance(src, Codes) or is_dask_array(src):  # packed Codes: the logical shape
        shape = tuple(src.shape)
    else:
        shape = tuple(backend_for(src)[1].shape)
    if len(group_shape) != len(shape):
        raise ValueError(f"group_shape must have one entry per dim of src: src shape {shape}, "
                         f"got group_shape {list(group_shape)}")
    pshape = tuple(-(-d // g) for d, g in zip(shape, group_shape))
    for name, p in (("scales", scales), ("zps", zps)):
        got = _shape_of(p)
        if p is not None and got is not None and got != pshape:
            raise ValueError(f"{name} must have shape {pshape} (src shape {shape} / group_shape "
                             f"{list(group_shape)}, rounded up), got shape {got}")
    return fn(src, scales, zps, block_size=tuple(group_shape), **kwargs)


def _shape_of(obj):
    if obj is None:
        return None
    shape = getattr(obj, "shape", None)
    if shape is not None:
        return tuple(shape)
    try:
        return tuple(np.shape(obj))
    except ValueError:  # ragged lists: quantize() reports them
        return None
