"""Foreign arrays in, the caller's array type out, on the caller's device and stream.

Every public entry point (``quantize``, ``dequantize``, ``choose_qparams``,
``quantize_dynamic`` and the op objects' calls) runs through
:func:`callers_type`, which looks at ``src`` once:

==========================  ==================================  ==========================  ==================
``src``                     gpuq works on                       device / stream of the work  results come back as
==========================  ==================================  ==========================  ==================
NumPy array                 itself                              host                         NumPy
list, tuple, Python scalar  ``np.asarray(src)`` (floats: f64)   host                         NumPy
CPU torch tensor            a zero-copy NumPy view              host                         torch (zero copy)
CUDA torch tensor           a zero-copy CuPy view               its device, torch's current  torch (zero copy)
                                                                stream there
CuPy array                  itself                              its device, CuPy's current   CuPy
                                                                stream there
JAX array (GPU)             ``cupy.from_dlpack`` (the DLPack    its device, CuPy's current   JAX
                            stream handshake orders it)         stream there
other CUDA arrays           ``__cuda_array_interface__`` or     their device, CuPy's         CuPy
(Numba, ...)                a CUDA ``__dlpack__``               current stream there
==========================  ==================================  ==========================  ==================

Codes without a dtype in the caller's library come back as :class:`gpuq.Codes`
whose ``data`` is the caller's array type (packed int4/uint4 bytes; fp8 bits
for CuPy, which has no fp8), except fp8 for torch, which comes back as a
torch fp8 tensor (torch fp8 tensors in are read as fp8 codes too).

torch tensors that require grad (an ``nn.Parameter``) are read as ``detach()``
reads them: gpuq never writes src and records nothing for autograd. Other
arguments (scales, zps, ``out``) may be any of these types too; ``out=`` is
written in place and returned as the caller gave it.

Nothing here imports torch, JAX or CuPy: a library is looked at only when it
is already in ``sys.modules`` (an object of its type cannot exist otherwise).
"""

from __future__ import annotations

import contextlib
import functools
import sys

import numpy as np

__all__ = ["callers_type", "adapt"]

#: :mod:`gpuq.torch` once it has registered gpuq's torch ops (None before): while torch
#: traces a tensor (``traced``), the public functions run their op (``route``) instead.
torch_ops = None


class _Adapted:
    """``src`` as gpuq's backends take it, how to hand results back, and where to run."""

    __slots__ = ("array", "wrap", "context")

    def __init__(self, array, wrap=None, context=None):
        self.array = array
        self.wrap = wrap  # backend array -> caller's type (None: return it as it is)
        self.context = context  # a context manager factory: device and stream of the call


def _torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(obj, torch.Tensor) else None


def is_dask_array(obj) -> bool:
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(obj, da.Array)


def _jax_array(obj):
    jax = sys.modules.get("jax")
    return jax if jax is not None and isinstance(obj, getattr(jax, "Array", ())) else None


@contextlib.contextmanager
def _on(device_id: int, stream=None):
    """CuPy's current device (and stream) for the duration of one call."""
    import cupy

    with cupy.cuda.Device(device_id):
        if stream is None:
            yield
        else:
            with stream:
                yield


def _fp8_names():
    """The code dtypes torch and ml_dtypes have and NumPy/CuPy lack (the table's float8 rows
    whose torch dtype has their name: torch holds fp6 codes as uint8)."""
    from ._codetypes import CODE_TYPES

    return tuple(row.torch for row in CODE_TYPES.values() if row.codec == "float8" and row.torch_native)


_FP8_NAMES = _fp8_names()
#: fp6: ml_dtypes has the type, torch not: its codes travel as uint8 (one code per byte).
def _uint8_on_torch():
    from ._codetypes import CODE_TYPES

    return tuple(n for n, row in CODE_TYPES.items()
                 if row.codec == "float8" and row.storage == "element" and not row.torch_native)


_UINT8_ON_TORCH = _uint8_on_torch()


def _torch_from_numpy(torch):
    def wrap(arr):
        if arr.dtype.name == "bfloat16":  # torch.from_numpy knows no ml_dtypes type: its bits
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        if arr.dtype.name in _FP8_NAMES:  # likewise fp8: torch's type of the same name
            return torch.from_numpy(arr.view(np.uint8)).view(getattr(torch, arr.dtype.name))
        if arr.dtype.name in _UINT8_ON_TORCH:
            return torch.from_numpy(arr.view(np.uint8))
        return torch.from_numpy(arr)

    return wrap


def _torch_fp8_name(t, torch):
    """The name of ``t``'s fp8 dtype (``"float8_e4m3fn"``, ``"float8_e5m2"``), or None."""
    for name in _FP8_NAMES:
        if getattr(torch, name, None) is not None and t.dtype == getattr(torch, name):
            return name
    return None


def _from_torch(t, torch):
    t = t.detach()  # requires_grad: read as detach() reads it (no copy, no graph)
    fp8 = _torch_fp8_name(t, torch)
    if t.device.type == "cpu":
        if t.dtype == torch.bfloat16:  # .numpy() refuses bfloat16: the same bits as ml_dtypes'
            from ._dtypes import bfloat16

            return _Adapted(t.view(torch.int16).numpy().view(bfloat16()), _torch_from_numpy(torch))
        if fp8 is not None:  # .numpy() refuses fp8 too: ml_dtypes' type of the same bits
            from ._codetypes import fp8_dtype

            return _Adapted(t.view(torch.uint8).numpy().view(fp8_dtype(fp8)), _torch_from_numpy(torch))
        return _Adapted(t.numpy(), _torch_from_numpy(torch))
    if t.device.type != "cuda":
        raise TypeError(f"src must be a CPU or CUDA torch tensor, got one on {t.device}")
    import cupy

    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    # torch's current stream on the tensor's device: the work is ordered after whatever
    # torch queued there (the producer) and before whatever torch queues next.
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(t.device).cuda_stream, dev)
    if t.dtype == torch.bfloat16:
        # torch's __cuda_array_interface__ has no bfloat16: DLPack, under torch's stream, so
        # the handshake has nothing to wait for (CuPy maps DLPack bfloat16 to ml_dtypes').
        with cupy.cuda.Device(dev), stream:
            arr = cupy.from_dlpack(t)
    else:
        with cupy.cuda.Device(dev):
            # __cuda_array_interface__ v2: zero copy, no stream of its own. CuPy has no fp8:
            # an fp8 tensor's bits as uint8, read as the Codes of its dtype.
            arr = cupy.asarray(t if fp8 is None else t.view(torch.uint8))
        if fp8 is not None:
            from ._codes import Codes

            arr = Codes(arr, tuple(arr.shape), fp8)
    return _Adapted(arr, torch.from_dlpack, functools.partial(_on, dev, stream))


def _wrap_codes(codes, wrap):
    """Codes in the caller's type: fp8 bits as a torch fp8 tensor where the caller is torch,
    else Codes whose data is the caller's array type."""
    from ._codes import Codes

    data = wrap(codes.data)
    torch = _torch_tensor(data)
    if torch is not None and codes.dtype in _FP8_NAMES:
        return data.view(getattr(torch, codes.dtype))
    return Codes(data, codes.shape, codes.dtype)


def adapt(src) -> _Adapted:
    """``src`` for the backends, the wrapper of results and the call's context (table above).

    >>> a = adapt([1.5, 2.0])
    >>> a.array.dtype, a.wrap is None
    (dtype('float64'), True)
    """
    if isinstance(src, np.ndarray):
        return _Adapted(src)
    if isinstance(src, (list, tuple, int, float, bool, np.generic)):
        return _Adapted(np.asarray(src))
    from ._codes import Codes

    if isinstance(src, Codes):  # its bytes adapted; the shape and dtype travel as they are
        inner = adapt(src.data)
        data = inner.array.data if isinstance(inner.array, Codes) else inner.array
        return _Adapted(Codes(data, src.shape, src.dtype), inner.wrap, inner.context)
    torch = _torch_tensor(src)
    if torch is not None:
        return _from_torch(src, torch)
    from ._dispatch import is_device_array

    if not is_device_array(src):
        jax = _jax_array(src)
        if jax is not None:  # a JAX array on the host
            return _Adapted(np.asarray(src), jax.numpy.asarray)
        return _Adapted(src)  # unsupported: the dispatcher names it in its TypeError
    from .backends.cuda.backend import CudaBackend

    arr = CudaBackend.as_array(src)
    jax = _jax_array(src)
    wrap = None if jax is None else jax.dlpack.from_dlpack
    return _Adapted(arr, wrap, functools.partial(_on, arr.device.id))


def _wrap_results(result, wrap, keep):
    if isinstance(result, tuple):
        return tuple(_wrap_results(r, wrap, keep) for r in result)
    if result is None or result is keep:
        return result
    from ._codes import Codes

    if isinstance(result, Codes):
        return _wrap_codes(result, wrap)
    return wrap(result)


def _plain(obj):
    """A torch tensor that requires grad (an ``nn.Parameter`` as scales, zps or ``out``) as
    ``detach()`` gives it (the same memory): torch refuses to export it otherwise."""
    torch = _torch_tensor(obj)
    return obj.detach() if torch is not None and obj.requires_grad else obj


def _writable_view(out):
    """``out`` as the backends write it: a CPU torch tensor (or Codes of one) as a zero-copy
    NumPy view, a GPU torch fp8 tensor as the Codes of its bits (the same memory either way,
    so the caller's object is what gets written); else as is."""
    from ._codes import Codes

    if isinstance(out, Codes):
        data = _writable_view(out.data)
        return out if data is out.data else Codes(data, out.shape, out.dtype)
    torch = _torch_tensor(out)
    if torch is not None and out.device.type == "cpu":
        return _from_torch(out, torch).array
    fp8 = None if torch is None else _torch_fp8_name(out, torch)
    if fp8 is not None:  # a GPU fp8 tensor: CuPy has no fp8, its bits are the Codes written
        return Codes(out.view(torch.uint8), tuple(out.shape), fp8)
    return out


def _same_out(result, plain_out, caller_out):
    if isinstance(result, tuple):
        return tuple(_same_out(r, plain_out, caller_out) for r in result)
    return caller_out if result is plain_out else result


def _call_on(fn, adapted, args, kwargs):
    """``fn(*args, **kwargs)`` in ``adapted``'s context, results in the caller's type."""
    keep = kwargs.get("out")
    if adapted.context is None:
        result = fn(*args, **kwargs)
        return result if adapted.wrap is None else _wrap_results(result, adapted.wrap, keep)
    with adapted.context():
        result = fn(*args, **kwargs)
        # Wrapped inside the context: a DLPack export orders the consumer after the
        # stream the work ran on, which is the current one only here.
        return result if adapted.wrap is None else _wrap_results(result, adapted.wrap, keep)


def _is_codes(obj) -> bool:
    from ._codes import Codes

    return isinstance(obj, Codes)


def callers_type(fn=None, *, arg=0):
    """Decorate a public function whose argument ``arg`` is ``src``: run it on the adapted
    array, under src's device and stream, and return results in the caller's type.

    A NumPy ``src`` takes no detour (one type check). ``out=`` comes back as given.
    """
    if fn is None:
        return functools.partial(callers_type, arg=arg)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        src = args[arg]
        if type(src) is np.ndarray:
            return fn(*args, **kwargs)
        if torch_ops is not None and torch_ops.traced(src):
            op = torch_ops.route(fn)
            if op is not None:  # else (the op objects) the eager call: a graph break
                return op(*args, **kwargs)
        if is_dask_array(src) or is_dask_array(getattr(src, "data", None)) and _is_codes(src):
            from . import _dask  # lazy graphs: gpuq._dask maps this same call over the chunks

            return _dask.call(call, fn, arg, args, kwargs)
        adapted = adapt(src)
        args = args[:arg] + tuple(_plain(a) for a in (adapted.array,) + args[arg + 1:])
        caller_out = kwargs.get("out")
        kwargs = {k: _plain(v) for k, v in kwargs.items()}
        if kwargs.get("out") is not None:
            kwargs["out"] = _writable_view(kwargs["out"])
        result = _call_on(fn, adapted, args, kwargs)
        if caller_out is not None and kwargs["out"] is not caller_out:
            return _same_out(result, kwargs["out"], caller_out)
        return result

    return call
