"""``cupy.ndarray`` of the stand-in and the array functions gpuq, its tests and bench use.

An :class:`ndarray` is a shape/dtype/strides/offset view of one
:class:`~._memory.Allocation` on one device. Views (slicing, ``reshape``,
``T``, ``view``, ``broadcast_to``) share the allocation, which lives as long
as any view (or queued work) refers to it. Shape arithmetic is delegated to
NumPy on a view of the allocation's real memory that is never read, so the
stand-in agrees with NumPy's (and CuPy's) rules.

Every operation that touches device memory allocates its result at once and
enqueues its work on the current stream of the current device (model:
:mod:`.cuda._streams`); only synchronisation points run it. Host reads
(``get``, ``asnumpy``, ``bool``, ``int``, ``float``, ``item``, ``tolist``,
``repr``) synchronise the stream they read on, like CuPy's. Uploads snapshot
the host data at the call. Arrays of other devices are refused like CuPy
refuses them without peer access (``ValueError``), except by ``copy()`` and
host reads, which CuPy also allows across devices.

Interop, checked strictly:

* ``__cuda_array_interface__`` (version 3, with ``stream``: the current
  stream, 1 for the legacy default stream). ``asarray`` of an object exposing
  one makes a zero-copy view of the registered allocation it points into
  (an unknown pointer, or an extent outside that allocation, raises) and, like
  CuPy, synchronises the producer's stream first unless
  ``CUPY_CUDA_ARRAY_INTERFACE_SYNC=0``.
* ``__dlpack__(stream=...)`` follows CuPy's producer side: when the
  consumer's stream differs from the current stream, an event recorded on the
  current stream is waited for on the consumer's stream. It returns a
  :class:`SimDLPackCapsule` (a private stand-in for the ``"dltensor"``
  PyCapsule, consumable once), which only this module's :func:`from_dlpack`
  understands. ``from_dlpack`` follows CuPy's consumer side: it passes its
  current stream of the producer's device (1 for the legacy stream).

Not modelled, hence absent or refused: advanced (integer/boolean array)
indexing, ``cupy.random``, ``ElementwiseKernel``, memory pools, fancy
``__array_ufunc__`` dispatch (NumPy functions on these arrays raise
``TypeError``, like CuPy's ``__array__``).
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from . import _memory
from .cuda import _pinned, _streams
from .cuda._streams import Device

_PY_SCALARS = (bool, int, float, complex)
_SUPPORTED_KINDS = "biufc"


def _supported(d: np.dtype) -> bool:
    # CuPy 14 also holds ml_dtypes.bfloat16 arrays (kind "V", a typename it knows where
    # ml_dtypes imports: cupy/_core/_scalar.pyx, _dtype.pyx).
    return d.kind in _SUPPORTED_KINDS or (d.name == "bfloat16" and d.itemsize == 2)


def _dtype(dt) -> np.dtype:
    d = np.dtype(dt)
    if not _supported(d):
        raise ValueError(f"Unsupported dtype {d}")
    return d.newbyteorder("=") if d.byteorder not in ("=", "|") else d


def _shape_tuple(shape) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    return shape


def _contiguous_strides(shape, itemsize, order="C") -> tuple:
    strides = []
    step = itemsize
    dims = reversed(shape) if order == "C" else shape
    for n in dims:
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides)) if order == "C" else tuple(strides)


def _is_contiguous(shape, strides, itemsize, order) -> bool:
    if 0 in shape:
        return True
    expected = itemsize
    pairs = zip(shape, strides)
    for n, s in (reversed(list(pairs)) if order == "C" else pairs):
        if n != 1:
            if s != expected:
                return False
            expected *= n
    return True


def _extent(off, shape, strides, itemsize):
    """Byte range ``[lo, hi)`` (from the allocation's start) a view touches; None when empty."""
    if 0 in shape:
        return None
    lo = hi = off
    for n, s in zip(shape, strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + itemsize


def _peer_error(arr, dev, what):
    return ValueError(f"The device where the array resides ({arr._device_id}) is different from the "
                      f"current device ({dev}) in {what}. Peer access is unavailable between these "
                      f"devices (the simulator models none).")


def _enqueue(fn, what):
    return _streams.enqueue(_streams.current_queue(), fn, what)


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: an address (``ptr``) inside one allocation (``mem``)."""

    __slots__ = ("mem", "ptr")

    def __init__(self, mem, offset: int = 0):
        self.mem = mem
        self.ptr = mem.ptr + int(offset)

    @property
    def device_id(self) -> int:
        return self.mem.device_id

    @property
    def device(self) -> Device:
        return Device(self.mem.device_id)

    def __add__(self, offset):
        return MemoryPointer(self.mem, self.ptr - self.mem.ptr + int(offset))

    def __int__(self):
        return self.ptr

    def __repr__(self):
        return f"<MemoryPointer 0x{self.ptr:x} in {self.mem!r}>"


class Flags:
    """``ndarray.flags``: contiguity as CuPy computes it (size-1 dimensions ignored)."""

    __slots__ = ("c_contiguous", "f_contiguous")

    def __init__(self, c, f):
        self.c_contiguous, self.f_contiguous = c, f

    def __getitem__(self, name):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous}[name]

    def __repr__(self):
        return f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}"


class ndarray:
    """``cupy.ndarray``: a view of device memory. See the module docstring."""

    __slots__ = ("__weakref__", "_dtype", "_mem", "_off", "_owner", "_shape", "_strides")
    # NumPy binary operators return NotImplemented for us, so Python calls our reflected
    # operator, which refuses NumPy arrays (CuPy's behaviour); np.* functions raise TypeError.
    __array_ufunc__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        shape = _shape_tuple(shape)
        dtype = _dtype(dtype)
        if order not in ("C", "F"):
            raise ValueError(f"order not understood: {order!r}")
        if memptr is None:
            if strides is not None:
                raise ValueError("strides need a memptr")
            new = ndarray._new(shape, dtype, order)  # on the current device, unless it is faulted
            mem, off, strides = new._mem, 0, new._strides
        else:
            if not isinstance(memptr, MemoryPointer):
                raise TypeError(f"memptr must be a cupy.cuda.MemoryPointer, got {type(memptr).__name__}")
            mem, off = memptr.mem, memptr.ptr - memptr.mem.ptr
            strides = _contiguous_strides(shape, dtype.itemsize, order) if strides is None \
                else tuple(int(s) for s in strides)
            if len(strides) != len(shape):
                raise ValueError("strides and shape differ in length")
            ext = _extent(off, shape, strides, dtype.itemsize)
            if ext is not None and (ext[0] < 0 or ext[1] > mem.nbytes):
                raise ValueError(f"the view's bytes [{ext[0]}, {ext[1]}) lie outside its allocation "
                                 f"of {mem.nbytes} bytes")
        self._init(mem, off, shape, strides, dtype, None)

    def _init(self, mem, off, shape, strides, dtype, owner):
        self._mem, self._off, self._shape, self._strides, self._dtype = mem, off, shape, strides, dtype
        self._owner = owner

    @classmethod
    def _view(cls, mem, off, shape, strides, dtype, owner=None):
        arr = object.__new__(cls)
        arr._init(mem, off, tuple(shape), tuple(strides), np.dtype(dtype), owner)
        return arr

    @classmethod
    def _new(cls, shape, dtype, order="C", device_id=None):
        dtype = _dtype(dtype)
        shape = _shape_tuple(shape)
        dev = _streams.current_device_id() if device_id is None else device_id
        _streams.device_state(dev).check()
        mem = _memory.Allocation(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, dev)
        return cls._view(mem, 0, shape, _contiguous_strides(shape, dtype.itemsize, order), dtype)

    # --- host views (only inside queued work) and metadata views (never read) ---------------

    def _host(self) -> np.ndarray:
        """A NumPy view of this array's memory: only queued work may call it."""
        if self.size == 0:
            return np.empty(self._shape, self._dtype)
        return np.ndarray(self._shape, self._dtype, buffer=self._mem.buf, offset=self._off,
                          strides=self._strides)

    def _meta(self):
        """``(view, origin)``: a NumPy array with this array's layout whose data address is
        ``origin + offset``; NumPy computes views of it, nothing ever reads it."""
        if self.size:
            return self._host(), self._mem.buf.ctypes.data
        blank = np.empty(0, self._dtype)
        view = np.lib.stride_tricks.as_strided(blank, self._shape, self._strides)
        return view, view.__array_interface__["data"][0] - self._off

    def _from_meta(self, view, origin):
        off = view.__array_interface__["data"][0] - origin
        ext = _extent(off, view.shape, view.strides, view.dtype.itemsize)
        if ext is not None and (ext[0] < 0 or ext[1] > self._mem.nbytes):
            raise AssertionError("internal: a metadata view left its allocation")  # a copy slipped in
        return ndarray._view(self._mem, off, view.shape, view.strides, view.dtype, self._owner)

    # --- attributes ------------------------------------------------------------------------

    shape = property(lambda self: self._shape)
    strides = property(lambda self: self._strides)
    dtype = property(lambda self: self._dtype)
    ndim = property(lambda self: len(self._shape))
    itemsize = property(lambda self: self._dtype.itemsize)
    size = property(lambda self: int(np.prod(self._shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self._dtype.itemsize)

    @property
    def _device_id(self) -> int:  # not CuPy's: real code asks arr.device.id
        return self._mem.device_id

    @property
    def device(self) -> Device:
        return Device(self._mem.device_id)

    @property
    def data(self) -> MemoryPointer:
        return MemoryPointer(self._mem, self._off)

    @property
    def flags(self) -> Flags:
        isz = self._dtype.itemsize
        return Flags(_is_contiguous(self._shape, self._strides, isz, "C"),
                     _is_contiguous(self._shape, self._strides, isz, "F"))

    @property
    def T(self):
        return self.transpose()

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of unsized object")
        return self._shape[0]

    def __iter__(self):
        if not self._shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self._shape[0]))

    # --- views -----------------------------------------------------------------------------

    def transpose(self, *axes):
        view, origin = self._meta()
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return self._from_meta(view.transpose(tuple(axes)) if axes else view.transpose(), origin)

    def view(self, dtype=None):
        if dtype is None:
            return ndarray._view(self._mem, self._off, self._shape, self._strides, self._dtype, self._owner)
        view, origin = self._meta()
        return self._from_meta(view.view(_dtype(dtype)), origin)

    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        shape = tuple(int(n) for n in shape) if not isinstance(shape, (int, np.integer)) else (int(shape),)
        view, origin = self._meta()
        try:
            res = np.reshape(view, shape, order=order, copy=False)
        except TypeError:  # NumPy < 2.1 has no copy=: reshape, and keep the result only if it is a view
            res = view.reshape(shape, order=order)
            if res.size and not np.may_share_memory(res, view):
                return self.copy(order=order).reshape(shape, order=order)
        except ValueError as exc:
            if "copy" not in str(exc):
                raise
            # Not expressible as a view: CuPy copies (one queued copy) and reshapes that.
            return self.copy(order=order).reshape(shape, order=order)
        return self._from_meta(res, origin)

    def ravel(self, order="C"):
        if _is_contiguous(self._shape, self._strides, self.itemsize, order):
            return self.reshape(-1, order=order)
        return self.copy(order=order).reshape(-1, order=order)

    def flatten(self, order="C"):
        return self.copy(order=order).reshape(-1, order=order)

    def squeeze(self, axis=None):
        view, origin = self._meta()
        return self._from_meta(view.squeeze(axis), origin)

    def __getitem__(self, key):
        view, origin = self._meta()
        return self._from_meta(view[_basic_key(key)], origin)

    # --- queued work -----------------------------------------------------------------------

    def _check_here(self, what):
        dev = _streams.current_device_id()
        if self._device_id != dev:
            raise _peer_error(self, dev, what)
        return dev

    def copy(self, order="C"):
        """A copy on the *current* device (CuPy: even from another device)."""
        if order == "K" or order == "A":
            order = "F" if self.flags.f_contiguous and not self.flags.c_contiguous else "C"
        flags = self.flags
        if self._device_id != _streams.current_device_id() and self.size and not (
                flags.c_contiguous or flags.f_contiguous):
            raise NotImplementedError("CuPy cannot copy non-contiguous array between devices.")
        res = ndarray._new(self._shape, self._dtype, order)
        src = self

        def run():
            res._host()[...] = src._host()

        _enqueue(run, "copy")
        return res

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        dtype = _dtype(dtype)
        if not copy and dtype == self._dtype:
            return self
        self._check_here("astype")
        if order in ("K", "A"):
            order = "F" if self.flags.f_contiguous and not self.flags.c_contiguous else "C"
        if casting is not None and not np.can_cast(self._dtype, dtype, casting):
            raise TypeError(f"Cannot cast array data from {self._dtype} to {dtype} according to the rule "
                            f"'{casting}'")
        res = ndarray._new(self._shape, dtype, order)
        src = self

        def run():
            with np.errstate(all="ignore"):
                np.copyto(res._host(), src._host(), casting="unsafe")

        _enqueue(run, "astype")
        return res

    def fill(self, value):
        self._check_here("fill")
        if isinstance(value, ndarray) or (isinstance(value, np.ndarray) and value.ndim):
            raise ValueError("fill takes a scalar")
        value = np.asarray(value)
        dst = self

        def run():
            with np.errstate(all="ignore"):
                dst._host()[...] = value

        _enqueue(run, "fill")

    def __setitem__(self, key, value):
        dst = self[key]
        dst._check_here("__setitem__")
        if isinstance(value, ndarray):
            value._check_here("__setitem__")
            np.broadcast_shapes(value.shape, dst.shape)  # raises ValueError like NumPy
            if np.broadcast_shapes(value.shape, dst.shape) != dst.shape:
                raise ValueError(f"could not broadcast input array from shape {value.shape} into "
                                 f"shape {dst.shape}")
            src = value

            def run():
                with np.errstate(all="ignore"):
                    np.copyto(dst._host(), src._host(), casting="unsafe")
        else:
            snap = np.array(value)  # a host value: snapshot now, like an upload
            if not _supported(snap.dtype):
                raise TypeError(f"Unsupported type {type(value)}")
            if np.broadcast_shapes(snap.shape, dst.shape) != dst.shape:
                raise ValueError(f"could not broadcast input array from shape {snap.shape} into "
                                 f"shape {dst.shape}")

            def run():
                with np.errstate(all="ignore"):
                    np.copyto(dst._host(), snap, casting="unsafe")

        _enqueue(run, "__setitem__")

    def set(self, arr, stream=None):
        """``ndarray.set``: upload the NumPy array ``arr`` (same dtype and shape)."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self._dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self._dtype} array")
        if arr.shape != self._shape:
            raise ValueError(f"Shape mismatch. Old shape: {self._shape}, new shape: {arr.shape}")
        # From pinned memory the copy is asynchronous: it reads arr when the queue runs (a buffer
        # refilled before that uploads the new bytes, as on a GPU). Pageable memory: a snapshot.
        snap = arr if stream is not None and _pinned.is_pinned(arr) else arr.copy()
        dst = self
        q = _streams.current_queue() if stream is None else _streams.queue_of(stream, self._device_id)

        def run():
            dst._host()[...] = snap

        _streams.enqueue(q, run, "ndarray.set")

    # --- reductions ------------------------------------------------------------------------

    def _reduce(self, fn, what, axis=None, keepdims=False, out=None, **kw):
        if out is not None:
            raise NotImplementedError(f"{what}(out=...) is not modelled by the simulator")
        self._check_here(what)
        # Result shape and dtype (and NumPy's errors for empty input) from a never-read stand-in.
        blank = np.lib.stride_tricks.as_strided(np.zeros(1, self._dtype), self._shape, (0,) * self.ndim)
        with np.errstate(all="ignore"):
            meta = np.asarray(fn(blank, axis=axis, keepdims=keepdims, **kw))
        res = ndarray._new(meta.shape, meta.dtype)
        src = self

        def run():
            with np.errstate(all="ignore"):
                res._host()[...] = fn(src._host(), axis=axis, keepdims=keepdims, **kw)

        _enqueue(run, what)
        return res

    def any(self, axis=None, out=None, keepdims=False):
        return self._reduce(np.any, "any", axis, keepdims, out)

    def all(self, axis=None, out=None, keepdims=False):
        return self._reduce(np.all, "all", axis, keepdims, out)

    def min(self, axis=None, out=None, keepdims=False):
        return self._reduce(np.min, "min", axis, keepdims, out)

    def max(self, axis=None, out=None, keepdims=False):
        return self._reduce(np.max, "max", axis, keepdims, out)

    def argmax(self, axis=None, out=None, keepdims=False):
        return self._reduce(np.argmax, "argmax", axis, keepdims, out)

    def argmin(self, axis=None, out=None, keepdims=False):
        return self._reduce(np.argmin, "argmin", axis, keepdims, out)

    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._reduce(np.sum, "sum", axis, keepdims, out, dtype=dtype)

    # --- host reads (synchronise) ----------------------------------------------------------

    def _read(self, what, stream=None, order="C", out=None):
        if self.size == 0 and out is None:
            return np.empty(self._shape, self._dtype, order=order)  # CuPy: no copy, no sync
        s = _streams.current_stream() if stream is None else stream
        q = _streams.queue_of(s, self._device_id)
        res = np.empty(self._shape, self._dtype, order=order) if out is None else out
        src = self

        def run():
            res[...] = src._host()
            return res

        return _streams.host_read(what, q, run)

    def get(self, stream=None, order="C", out=None, blocking=True):
        """A NumPy copy; like CuPy: copied on ``stream`` (default: the current stream) and,
        with ``blocking`` (the default), that stream is synchronised."""
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self._dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self._dtype} array")
            if out.shape != self._shape:
                raise ValueError(f"Shape mismatch. Expected shape: {self._shape}, actual shape: {out.shape}")
        order = order.upper()
        if order == "A":
            order = "F" if self.flags.f_contiguous else "C"
        if blocking:
            return self._read("ndarray.get", stream, order, out)
        s = _streams.current_stream() if stream is None else stream
        q = _streams.queue_of(s, self._device_id)
        res = np.empty(self._shape, self._dtype, order=order) if out is None else out
        src = self

        def run():
            res[...] = src._host()

        _streams.enqueue(q, run, "ndarray.get(blocking=False)")
        return res  # filled when that stream runs: the caller must synchronise

    def _scalar(self, what):
        if self.size != 1:
            raise TypeError(f"only size-1 arrays can be converted to Python scalars ({what})")
        return self._read(what).reshape(())[()]

    def __bool__(self):
        if self.size == 0:
            warnings.warn("The truth value of an empty array is ambiguous. Returning False, but in "
                          "future this will result in an error. Use `array.size > 0` to check that an "
                          "array is not empty.", DeprecationWarning, stacklevel=2)
            return False
        if self.size > 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. "
                             "Use a.any() or a.all()")
        return bool(self._scalar("ndarray.__bool__"))

    def __int__(self):
        return int(self._scalar("ndarray.__int__"))

    def __float__(self):
        return float(self._scalar("ndarray.__float__"))

    def __complex__(self):
        return complex(self._scalar("ndarray.__complex__"))

    def item(self):
        return self._scalar("ndarray.item").item()

    def tolist(self):
        return self._read("ndarray.tolist").tolist()

    def __repr__(self):
        return repr(self._read("ndarray.__repr__"))

    def __str__(self):
        return str(self._read("ndarray.__str__"))

    def __format__(self, spec):
        return format(self._read("ndarray.__format__"), spec)

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    # --- interop ---------------------------------------------------------------------------

    @property
    def __cuda_array_interface__(self):
        q = _streams.current_queue()
        return {
            "shape": self._shape,
            "typestr": self._dtype.str,
            "descr": [("", self._dtype.str)],
            "stream": q.export_ptr,  # CAI v3: the current stream, never 0 (legacy: 1)
            "version": 3,
            "strides": None if self.flags.c_contiguous else self._strides,
            "data": (self.data.ptr if self.size > 0 else 0, False),
        }

    def __dlpack_device__(self):
        return (2, self._device_id)  # kDLCUDA

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            if tuple(dl_device) == (1, 0):
                raise NotImplementedError("DLPack export to the CPU is not modelled by the simulator")
            raise BufferError("unsupported device requested.")
        if copy is True:
            raise BufferError("copy=True only supported for copy to CPU.")
        if stream is None:
            consumer = _streams.STREAM_LEGACY
        elif isinstance(stream, int) and not isinstance(stream, bool):
            consumer = stream
        else:
            consumer = -2
        if consumer < -1:
            raise ValueError(f"On CUDA, the valid stream for the DLPack protocol is -1, 1, 2, or any "
                             f"larger value, but {stream} was provided")
        if consumer == 0:
            warnings.warn("Stream 0 is passed from a library that you are converting to; CuPy assumes "
                          "0 as a legacy default stream. Please report this problem to the library as "
                          "this violates the DLPack protocol.")
            consumer = _streams.STREAM_LEGACY
        current = _streams.current_queue()
        if consumer != -1 and consumer != current.export_ptr:
            # The consumer's stream must not run ahead of the work queued on ours.
            target = _streams.queue_of(_streams.ExternalStream(consumer))
            pos = _streams.enqueue(current, None, "__dlpack__ event record")
            _streams.enqueue(target, None, "__dlpack__ stream wait", waits=(pos,))
        versioned = max_version is not None and int(max_version[0]) >= 1
        return SimDLPackCapsule(self, versioned)

    # --- arithmetic ------------------------------------------------------------------------

    def __neg__(self):
        return _elementwise(np.negative, (self,))

    def __pos__(self):
        return _elementwise(np.positive, (self,))

    def __abs__(self):
        return _elementwise(np.absolute, (self,))

    def __invert__(self):
        return _elementwise(np.invert, (self,))


def _binary(ufunc, reflected=False, inplace=False):
    def op(self, other):
        if not _acceptable(other):
            return NotImplemented
        if inplace:
            return _elementwise(ufunc, (self, other), out=self)
        return _elementwise(ufunc, (other, self) if reflected else (self, other))

    op.__name__ = f"__{'i' if inplace else 'r' if reflected else ''}{ufunc.__name__}__"
    return op


def _acceptable(x) -> bool:
    return isinstance(x, (ndarray, np.generic, np.ndarray) + _PY_SCALARS)


for _name, _uf in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                   ("floordiv", np.floor_divide), ("mod", np.remainder), ("pow", np.power),
                   ("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor),
                   ("lshift", np.left_shift), ("rshift", np.right_shift)]:
    setattr(ndarray, f"__{_name}__", _binary(_uf))
    setattr(ndarray, f"__r{_name}__", _binary(_uf, reflected=True))
    setattr(ndarray, f"__i{_name}__", _binary(_uf, inplace=True))
for _name, _uf in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)]:
    setattr(ndarray, f"__{_name}__", _binary(_uf))
ndarray.__hash__ = None  # like NumPy/CuPy arrays (__eq__ is elementwise)


def _elementwise(ufunc, operands, out=None):
    """``ufunc(*operands)`` on the current device: result allocated now, work queued."""
    dev = _streams.current_device_id()
    stand_ins = []
    for o in operands:
        if isinstance(o, ndarray):
            if o._device_id != dev:
                raise _peer_error(o, dev, ufunc.__name__)
            stand_ins.append(np.zeros((), o.dtype))
        elif isinstance(o, np.ndarray):
            raise TypeError(f"Unsupported type {type(o)}")  # CuPy refuses NumPy arrays as operands
        elif isinstance(o, (np.generic,) + _PY_SCALARS):
            stand_ins.append(o)  # Python scalars stay "weak" (NEP 50), as in NumPy and CuPy
        else:
            raise TypeError(f"Unsupported type {type(o)}")
    # NumPy decides the result dtype (and raises its errors, e.g. 300 for uint8) from 0-d stand-ins.
    with np.errstate(all="ignore"):
        dtype = np.asarray(ufunc(*stand_ins)).dtype
    shape = np.broadcast_shapes(*[o.shape for o in operands if isinstance(o, ndarray)], ())
    if out is None:
        res = ndarray._new(shape, dtype)
    else:
        if out._device_id != dev:
            raise _peer_error(out, dev, ufunc.__name__)
        if np.broadcast_shapes(shape, out.shape) != out.shape:
            raise ValueError(f"non-broadcastable output operand with shape {out.shape} doesn't match "
                             f"the broadcast shape {shape}")
        if not np.can_cast(dtype, out.dtype, "same_kind"):
            raise TypeError(f"Cannot cast ufunc '{ufunc.__name__}' output from {dtype} to {out.dtype} "
                            f"with casting rule 'same_kind'")
        res = out
    args = tuple(operands)

    def run():
        with np.errstate(all="ignore"):
            ufunc(*[a._host() if isinstance(a, ndarray) else a for a in args], out=res._host())

    _enqueue(run, f"elementwise {ufunc.__name__}")
    return res


def _basic_key(key):
    """``key`` for NumPy's basic indexing, always ending in ``...`` so that an integer index
    gives a 0-d view (never a scalar read from memory); anything else is refused."""
    parts = key if isinstance(key, tuple) else (key,)
    for k in parts:
        if k is None or k is Ellipsis or isinstance(k, slice):
            continue
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            raise NotImplementedError(
                f"index {k!r} ({type(k).__name__}): only basic indexing (integers, slices, ..., None) "
                f"is modelled by the simulator")
    if not any(k is Ellipsis for k in parts):
        parts = parts + (Ellipsis,)
    return parts


# --- DLPack ------------------------------------------------------------------------------------

class SimDLPackCapsule:
    """The simulator's stand-in for a ``"dltensor"`` PyCapsule: the exported view's allocation
    and layout. Consumable once (a real capsule is renamed ``"used_dltensor"``)."""

    __slots__ = ("_arr", "used", "versioned")

    def __init__(self, arr, versioned):
        self._arr = arr
        self.versioned = versioned
        self.used = False

    def __repr__(self):
        return f"<SimDLPackCapsule {'used ' if self.used else ''}{self._arr.shape} {self._arr.dtype}>"


def _consume(capsule):
    if not isinstance(capsule, SimDLPackCapsule):
        raise TypeError(f"the simulator's from_dlpack understands only its own DLPack capsules, got "
                        f"{type(capsule).__name__} (another library's memory is not simulated memory)")
    if capsule.used:
        raise ValueError("A DLPack tensor object cannot be consumed multiple times")
    capsule.used = True
    a = capsule._arr
    return ndarray._view(a._mem, a._off, a._shape, a._strides, a._dtype, owner=capsule)


def from_dlpack(array, *, device=None, copy=None):
    """``cupy.from_dlpack``: zero-copy import; the producer orders its work before our current stream."""
    if not hasattr(array, "__dlpack_device__"):
        return _consume(array)
    dev_type, dev_id = array.__dlpack_device__()
    if device is not None:
        raise NotImplementedError("from_dlpack() does not support device yet.")
    if dev_type in (2, 13):  # kDLCUDA, kDLCUDAManaged
        prev = _streams.current_device_id()
        try:
            _streams.set_current_device(dev_id)
            stream = _streams.current_queue().export_ptr
            try:
                capsule = array.__dlpack__(stream=stream, max_version=(1, 0), copy=copy)
            except TypeError:
                if copy is not None:
                    raise
                capsule = array.__dlpack__(stream=stream)
        finally:
            _streams.set_current_device(prev)
    elif dev_type == 1:
        raise TypeError("CPU arrays cannot be directly imported to CuPy. "
                        "Use `cupy.array(numpy.from_dlpack(input))` instead.")
    else:
        raise TypeError(f"Unsupported array type: {dev_type}")
    res = _consume(capsule)
    if res._device_id != dev_id:
        raise ValueError(f"DLPack device {dev_id} but the memory is on device {res._device_id}")
    return res


# --- __cuda_array_interface__ import -----------------------------------------------------------

def _cai_sync_enabled() -> bool:
    return os.environ.get("CUPY_CUDA_ARRAY_INTERFACE_SYNC", "1") != "0"


def _from_cai(obj):
    desc = obj.__cuda_array_interface__
    version = desc.get("version")
    if version not in (0, 1, 2, 3):
        raise ValueError(f"unsupported __cuda_array_interface__ version {version!r}")
    shape = _shape_tuple(desc["shape"])
    dtype = np.dtype(desc["typestr"])
    if dtype.byteorder == ">":
        raise ValueError("CuPy does not support the big-endian byte-order")
    dtype = _dtype(dtype)
    if desc.get("mask") is not None:
        raise ValueError("CuPy currently does not support masked arrays.")
    ptr = int(desc["data"][0])
    strides = desc.get("strides")
    strides = _contiguous_strides(shape, dtype.itemsize) if strides is None else tuple(int(s) for s in strides)
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0:
        mem, off = _memory.Allocation(0, _streams.current_device_id()), 0
    else:
        mem = _memory.find(ptr)
        if mem is None:
            raise ValueError(f"__cuda_array_interface__ pointer 0x{ptr:x} is not in any live device "
                             f"allocation of the simulator")
        off = ptr - mem.ptr
        lo, hi = _extent(off, shape, strides, dtype.itemsize)
        if lo < 0 or hi > mem.nbytes:
            raise ValueError(f"__cuda_array_interface__ view [{lo}, {hi}) lies outside its allocation "
                             f"{mem!r}")
    stream = desc.get("stream")
    if stream is not None:
        if version < 3:
            raise ValueError(f"'stream' in a version {version} __cuda_array_interface__")
        if stream == 0:
            raise ValueError("__cuda_array_interface__ v3 forbids stream 0")
        if _cai_sync_enabled():
            q = _streams.queue_of(_streams.ExternalStream(stream), mem.device_id)
            _streams.sync_queue(q, "__cuda_array_interface__ import")
    return ndarray._view(mem, off, shape, strides, dtype, owner=obj)


# --- creation ----------------------------------------------------------------------------------

def _upload(obj, dtype=None, order="K", ndmin=0, blocking=False):
    if isinstance(obj, (list, tuple)) and any(isinstance(o, ndarray) for o in obj):
        raise NotImplementedError("lists of device arrays are not modelled by the simulator")
    # The snapshot: later changes to obj do not reach the device (CuPy copies to a staging buffer).
    host = np.array(obj, dtype=dtype, copy=True, ndmin=ndmin)
    if not _supported(host.dtype):
        raise ValueError(f"Unsupported dtype {host.dtype}")
    host = host.astype(_dtype(host.dtype), copy=False)
    if order in ("K", "A", None):
        order = "F" if isinstance(obj, np.ndarray) and obj.flags.f_contiguous and not obj.flags.c_contiguous \
            else "C"
    res = ndarray._new(host.shape, host.dtype, order)

    def run():
        res._host()[...] = host

    q = _streams.current_queue()
    _streams.enqueue(q, run, "upload")
    if blocking:
        _streams.sync_queue(q, "asarray(blocking=True)")
    return res


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    if isinstance(obj, ndarray) or (not isinstance(obj, np.ndarray) and hasattr(obj, "__cuda_array_interface__")):
        a = obj if isinstance(obj, ndarray) else _from_cai(obj)
        if ndmin > a.ndim:
            a = a.reshape((1,) * (ndmin - a.ndim) + a.shape)
        if dtype is not None and _dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError("Unable to avoid copy while creating an array as requested.")
            return a.astype(dtype)
        if copy:
            return a.copy(order="C" if order in ("K", "A", None) else order)
        return a
    if copy is False:
        raise ValueError("Unable to avoid copy while creating an array from host data.")
    return _upload(obj, dtype, order, ndmin, blocking)


def asarray(a, dtype=None, order=None, *, copy=None, blocking=False):
    return array(a, dtype, copy, order, blocking=blocking)


def ascontiguousarray(a, dtype=None):
    if not isinstance(a, ndarray):
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy.ndarray, got {type(a).__name__})")
    same = dtype is None or _dtype(dtype) == a.dtype
    if same and a.flags.c_contiguous:
        return a.reshape(1) if a.ndim == 0 else a  # CuPy: a 0-d array comes back 1-d
    a._check_here("ascontiguousarray")
    res = ndarray._new((1,) if a.ndim == 0 else a.shape, a.dtype if dtype is None else dtype)
    src = a

    def run():
        with np.errstate(all="ignore"):
            np.copyto(res._host(), src._host().reshape(res.shape), casting="unsafe")

    _enqueue(run, "ascontiguousarray")
    return res


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    if isinstance(a, ndarray) or (not isinstance(a, np.ndarray) and hasattr(a, "__cuda_array_interface__")):
        arr = a if isinstance(a, ndarray) else _from_cai(a)
        if blocking and out is None and arr.size:
            return arr._read("asnumpy", stream, order.upper() if order.upper() in "CF" else "C")
        return arr.get(stream=stream, order=order, out=out, blocking=blocking)
    temp = np.asarray(a, order=order)
    if out is not None:
        out[...] = temp
        return out
    return temp


def empty(shape, dtype=float, order="C"):
    return ndarray._new(shape, dtype, order)


def _filled(shape, dtype, value, order, what):
    res = ndarray._new(shape, dtype, order)
    v = np.asarray(value)

    def run():
        with np.errstate(all="ignore"):
            res._host()[...] = v

    _enqueue(run, what)
    return res


def zeros(shape, dtype=float, order="C"):
    return _filled(shape, dtype, 0, order, "zeros")


def ones(shape, dtype=float, order="C"):
    return _filled(shape, dtype, 1, order, "ones")


def full(shape, fill_value, dtype=None, order="C"):
    if isinstance(fill_value, ndarray):
        raise NotImplementedError("full() with a device fill value is not modelled by the simulator")
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    # NumPy's assignment rules (e.g. OverflowError for 300 into uint8) at the call, like CuPy.
    value = np.empty((), _dtype(dtype))
    value[()] = fill_value
    return _filled(shape, dtype, value, order, "full")


def _like_order(a, order):
    if order in ("K", "A"):
        flags = a.flags
        return "F" if flags.f_contiguous and not flags.c_contiguous else "C"
    return order


def empty_like(a, dtype=None, order="K", subok=None, shape=None):
    return empty(a.shape if shape is None else shape, a.dtype if dtype is None else dtype, _like_order(a, order))


def zeros_like(a, dtype=None, order="K", subok=None, shape=None):
    return zeros(a.shape if shape is None else shape, a.dtype if dtype is None else dtype, _like_order(a, order))


def ones_like(a, dtype=None, order="K", subok=None, shape=None):
    return ones(a.shape if shape is None else shape, a.dtype if dtype is None else dtype, _like_order(a, order))


def full_like(a, fill_value, dtype=None, order="K", subok=None, shape=None):
    return full(a.shape if shape is None else shape, fill_value, a.dtype if dtype is None else dtype,
                _like_order(a, order))


def arange(start, stop=None, step=1, dtype=None):
    return _upload(np.arange(start, stop, step, dtype=dtype))


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0):
    host = np.linspace(start, stop, num, endpoint=endpoint, retstep=retstep, axis=axis)
    if retstep:
        host, step = host
    with np.errstate(all="ignore"):
        host = host.astype(np.float64 if dtype is None else dtype)
    res = _upload(host)
    return (res, step) if retstep else res


def broadcast_to(array, shape):
    if not isinstance(array, ndarray):
        raise TypeError(f"Argument 'array' has incorrect type (expected cupy.ndarray, got {type(array).__name__})")
    view, origin = array._meta()
    return array._from_meta(np.broadcast_to(view, _shape_tuple(shape)), origin)


def copyto(dst, src, casting="same_kind", where=None):
    if not isinstance(dst, ndarray):
        raise TypeError(f"dst must be a cupy.ndarray, got {type(dst).__name__}")
    dst._check_here("copyto")
    # NumPy's casting rules at the call (a 0-d stand-in of each side, never read).
    if isinstance(src, ndarray):
        src._check_here("copyto")
        np.copyto(np.empty((), dst.dtype), np.zeros((), src.dtype), casting=casting)
        src_shape = src.shape
    elif isinstance(src, (np.generic,) + _PY_SCALARS):
        np.copyto(np.empty((), dst.dtype), src, casting=casting)
        src_shape = ()
    else:
        raise TypeError(f"Unsupported type {type(src)}")
    if np.broadcast_shapes(src_shape, dst.shape) != dst.shape:
        raise ValueError(f"could not broadcast input array from shape {src_shape} into shape {dst.shape}")
    if where is not None:
        if not isinstance(where, ndarray):
            raise TypeError("where must be a cupy.ndarray")
        where._check_here("copyto")
        if np.broadcast_shapes(where.shape, dst.shape) != dst.shape:
            raise ValueError(f"could not broadcast where mask from shape {where.shape} into shape {dst.shape}")

    def run():
        with np.errstate(all="ignore"):
            np.copyto(dst._host(), src._host() if isinstance(src, ndarray) else src, casting="unsafe",
                      where=True if where is None else where._host())

    _enqueue(run, "copyto")


def may_share_memory(a, b, max_work=None):
    """Bounds check like CuPy's: the same allocation and overlapping byte ranges."""
    if not (isinstance(a, ndarray) and isinstance(b, ndarray)):
        raise TypeError("may_share_memory takes cupy.ndarray arguments")
    if a._mem is not b._mem:
        return False  # allocations never overlap one another
    ea = _extent(a._off, a.shape, a.strides, a.itemsize)
    eb = _extent(b._off, b.shape, b.strides, b.itemsize)
    if ea is None or eb is None:
        return False
    return ea[0] < eb[1] and eb[0] < ea[1]
