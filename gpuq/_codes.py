"""Codes whose array type has no dtype for them: packed int4/uint4/fp4, and fp8/fp6 on CuPy.

NumPy and CuPy have no 4-bit integer, and CuPy (14.x) no float8 either. Such
codes travel as a :class:`Codes`: the raw bytes in the caller's array type
plus the logical shape and the code dtype's name, so that
:func:`gpuq.dequantize` needs nothing else to read them back.

* int4/uint4: ``data`` is a 1-D C-contiguous uint8 array of ``ceil(n / 2)``
  bytes in ONNX's order over the C-order flattened tensor: element ``2k`` in
  the low nibble of byte ``k``, element ``2k + 1`` in the high nibble, an odd
  count padding the last high nibble with 0. int4 nibbles are two's complement.
  The bytes are what ONNX's ``raw_data`` and safetensors files hold. fp4 (``float4_e2m1fn``)
  packs the same way, each nibble an e2m1 code (sign in bit 3).
* fp8 on CuPy: ``data`` is a uint8 array of the fp8 bits in the logical shape
  (NumPy results are ml_dtypes fp8 arrays and torch results torch fp8 tensors
  instead: those libraries have the type).
"""

from __future__ import annotations

import math
import operator
import sys

import numpy as np

from ._codetypes import CODE_TYPES, code_type, fp8_dtype

__all__ = ["Codes", "pack", "unpack"]


class Codes:
    """Quantized codes with their logical shape and code dtype (see the module docstring).

    ``Codes(data, shape, dtype)`` checks that ``data`` fits: a uint8 array of
    ``ceil(prod(shape) / 2)`` elements, 1-D and C-contiguous, for int4/uint4;
    a uint8 array of ``shape`` for fp8.

    >>> import numpy as np, gpuq
    >>> c = gpuq.quantize(np.array([1.0, -2.0, 3.0], np.float32), 1.0, dtype="int4")
    >>> c
    Codes(shape=(3,), dtype='int4', data=array([225,   3], dtype=uint8))
    >>> c.shape, c.dtype, c.nbytes, gpuq.unpack(c).tolist()
    ((3,), 'int4', 2, [1, -2, 3])
    """

    __slots__ = ("data", "shape", "dtype")

    def __init__(self, data, shape, dtype):
        fmt = code_type(dtype)  # a name, or ml_dtypes' type/dtype of the same name
        if fmt is None or fmt.storage == "element" and fmt.codec == "affine":  # those are arrays
            exc = ValueError if isinstance(dtype, str) else TypeError
            names = ", ".join(n for n, row in CODE_TYPES.items() if row.storage == "packed" or row.codec != "affine")
            raise exc(f"dtype must be one of {names}, got {dtype!r}")
        try:
            if any(isinstance(d, (bool, np.bool_)) for d in shape):
                raise TypeError
            shape = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"shape must be a tuple of non-negative ints, got {shape!r}") from None
        if any(d < 0 for d in shape):
            raise ValueError(f"shape must be a tuple of non-negative ints, got {shape!r}")
        dt = getattr(data, "dtype", None)
        if dt is None or not _is_uint8(dt) or not hasattr(data, "shape"):
            raise TypeError(f"data must be a uint8 array, got {type(data).__qualname__} "
                            f"of dtype {dt}")
        packed = fmt.storage == "packed"
        want = (fmt.packed_size(math.prod(shape)),) if packed else shape
        if tuple(data.shape) != want:
            what = "ceil(prod(shape) / 2) bytes, 1-D" if packed else "the shape"
            raise ValueError(f"data must hold {what} for {fmt.name} codes of shape {shape}: "
                             f"expected data.shape {want}, got {tuple(data.shape)}")
        if packed and not _c_contiguous(data):
            raise ValueError("data of int4/uint4 codes must be C-contiguous (the bytes are packed), "
                             f"got a strided view (strides {getattr(data, 'strides', None)})")
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", fmt.name)

    def __setattr__(self, name, value):
        raise AttributeError("Codes is immutable: make a new one")

    def __delattr__(self, name):
        raise AttributeError("Codes is immutable: make a new one")

    def __reduce__(self):
        # pickle, copy.copy and copy.deepcopy rebuild through __init__ (its checks included):
        # Codes cross processes (ProcessPoolExecutor, Dask's client.submit) as what they are.
        return (Codes, (self.data, self.shape, self.dtype))

    def equals(self, other) -> bool:
        """Same code dtype, same logical shape and the same bytes, wherever the data lives
        (a device comparison reads one flag back).

        >>> import numpy as np, gpuq
        >>> a = gpuq.quantize(np.array([1.0, -2.0, 3.0], np.float32), 1.0, dtype="int4")
        >>> a.equals(gpuq.pack(np.array([1, -2, 3], np.int8))), a.equals(gpuq.unpack(a))
        (True, False)
        """
        if not isinstance(other, Codes) or (self.dtype, self.shape) != (other.dtype, other.shape):
            return False
        a, b = self.data, other.data
        if type(a) is not type(b) or tuple(a.shape) != tuple(b.shape):
            return False
        if isinstance(a, np.ndarray):
            return bool(np.array_equal(a, b))
        return bool((a == b).all())  # CuPy, torch: compared where they live

    def __eq__(self, other):
        """Value equality (:meth:`equals`) for codes on the host; a ``TypeError`` for device data,
        whose comparison would synchronise: call ``equals`` for that, knowingly."""
        if not isinstance(other, Codes):
            return NotImplemented
        for data in (self.data, other.data):
            if not _on_host(data):  # host data (NumPy, a CPU torch tensor) compares at once
                raise TypeError(f"== on Codes compares host data only; these hold "
                                f"{type(data).__module__}.{type(data).__qualname__} data: use "
                                f"a.equals(b) (it reads the result back from the device)")
        return self.equals(other)

    # Equal by value, and the data is the caller's array (out= writes into it): unhashable.
    # Immutable means the attributes: data, shape and dtype stay the objects they were made with.
    __hash__ = None

    def __array__(self, *args, **kwargs):
        raise TypeError(f"a gpuq.Codes is not an array: its {self.dtype} codes are "
                        f"{'packed two per byte' if code_type(self.dtype).storage == 'packed' else 'bits'}"
                        f" in codes.data; use codes.data for those bytes, or gpuq.unpack(codes) for "
                        f"one code per element")

    @property
    def size(self) -> int:
        """Number of codes (the logical shape's product)."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of ``data``: half the codes' count (rounded up) for int4."""
        return int(self.data.size)

    def __repr__(self) -> str:
        return f"Codes(shape={self.shape}, dtype={self.dtype!r}, data={self.data!r})"


def _is_uint8(dt) -> bool:
    """Whether ``dt`` is the uint8 of NumPy, CuPy, Dask (NumPy dtypes) or torch."""
    torch = sys.modules.get("torch")
    torch_dtype = getattr(torch, "dtype", None)  # None: no torch, or a stand-in module without dtypes
    if torch_dtype is not None and isinstance(dt, torch_dtype):  # first: dynamo traces no caught TypeError
        return dt == torch.uint8
    try:
        return np.dtype(dt) == np.uint8
    except TypeError:
        return False


def _c_contiguous(a) -> bool:
    flags = getattr(a, "flags", None)
    if flags is not None and hasattr(flags, "c_contiguous"):
        return bool(flags.c_contiguous)
    is_contiguous = getattr(a, "is_contiguous", None)  # torch
    return bool(is_contiguous()) if callable(is_contiguous) else True


def _xp(a):
    """NumPy or CuPy, whichever ``a`` belongs to."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(a, cupy.ndarray):
        return cupy
    return np


def _ml_int4(name):
    """ml_dtypes' dtype ``name`` ("int4"/"uint4") where ml_dtypes is loaded, else None."""
    ml_dtypes = sys.modules.get("ml_dtypes")
    return None if ml_dtypes is None else np.dtype(getattr(ml_dtypes, name))


def pack(codes, dtype=None) -> Codes:
    """Pack int8 (int4) or uint8 (uint4) codes two per byte into :class:`Codes`.

    ``dtype``: "int4", "uint4" or "float4_e2m1fn" (uint8 e2m1 bits, 0..15); by default the type
    of an ml_dtypes int4/uint4/float4_e2m1fn array (which ``pack`` also takes), else "int4". The values must lie in the
    code range ([-8, 7] or [0, 15]): ``ValueError`` otherwise. NumPy or CuPy
    arrays; the result's ``data`` is the same kind.

    >>> import numpy as np, gpuq
    >>> gpuq.pack(np.array([[1, -2, 3]], np.int8)).data
    array([225,   3], dtype=uint8)
    """
    if isinstance(codes, Codes):
        raise TypeError(f"codes are already packed (a gpuq.Codes of {codes.dtype}): pack takes one "
                        f"code per element, as gpuq.unpack(codes) gives them")
    if dtype is None:
        row = code_type(getattr(getattr(codes, "dtype", None), "name", None))
        dtype = row.name if row is not None and row.storage == "packed" else "int4"
    fmt = code_type(dtype) if isinstance(dtype, str) else None
    if fmt is None or fmt.storage != "packed":
        raise ValueError(f"dtype must be 'int4', 'uint4' or 'float4_e2m1fn', got {dtype!r}")
    fp4 = fmt.codec == "float8"  # fp4's codes are the e2m1 bits, 0..15, as uint8
    want = np.int8 if fmt.signed and not fp4 else np.uint8
    ml = _ml_int4(fmt.name)
    if ml is not None and getattr(codes, "dtype", None) == ml:  # (np.dtype(...) == None is float64)
        # one nibble per byte, upper bits 0: widened (int4) or its bits (fp4), not viewed
        codes = codes.view(np.uint8).copy() if fp4 else codes.astype(want)
    if getattr(codes, "dtype", None) != want:
        article = "an" if fmt.signed else "a"
        raise TypeError(f"codes must be {article} {np.dtype(want).name} array for {fmt.name}, "
                        f"got {type(codes).__qualname__} of dtype {getattr(codes, 'dtype', None)}")
    xp = _xp(codes)
    flat = xp.ascontiguousarray(codes).reshape(-1)
    lo, hi = (0, 15) if fp4 else (fmt.qmin, fmt.qmax)
    if flat.size and (int(flat.min()) < lo or int(flat.max()) > hi):
        raise ValueError(f"codes must lie in [{lo}, {hi}] for {fmt.name}, "
                         f"got values in [{int(flat.min())}, {int(flat.max())}]")
    nib = flat.view(xp.uint8) & 0x0F
    data = xp.zeros((flat.size + 1) // 2, xp.uint8)
    data[:] = nib[0::2]
    data[: flat.size // 2] |= nib[1::2] << 4
    return Codes(data, codes.shape, fmt.name)


def unpack(codes: Codes):
    """The codes of a :class:`Codes` one per element, in its logical shape.

    int4 gives int8, uint4 uint8 (a new array); fp8 gives the bits' array
    reshaped, as an ml_dtypes fp8 array on the host; fp4 the e2m1 bits one per byte (a new
    array: ml_dtypes' ``float4_e2m1fn`` on the host, uint8 on CuPy).

    >>> import numpy as np, gpuq
    >>> gpuq.unpack(gpuq.Codes(np.array([0xE1, 0x03], np.uint8), (3,), "int4"))
    array([ 1, -2,  3], dtype=int8)
    """
    if not isinstance(codes, Codes):
        raise TypeError(f"codes must be a gpuq.Codes, got {type(codes).__qualname__}")
    fmt = code_type(codes.dtype)
    data = codes.data
    xp = _xp(data)
    if fmt.storage == "element":  # fp8 bits (CuPy has no fp8 dtype)
        return data.view(fp8_dtype(fmt.name)) if xp is np else data
    n = codes.size
    out = xp.empty(2 * data.size, xp.uint8)
    out[0::2] = data & 0x0F
    out[1::2] = data >> 4
    out = out[:n]
    if fmt.codec == "float8":  # fp4: the e2m1 bits, one per byte (ml_dtypes' float4 on the host)
        return (out.view(fp8_dtype(fmt.name)) if xp is np else out).reshape(codes.shape)
    if fmt.signed:  # sign-extend the nibble: (v ^ 8) - 8
        out = ((out ^ 8).astype(xp.int8) - 8).astype(xp.int8)
    return out.reshape(codes.shape)


def _on_host(data) -> bool:
    """True for NumPy arrays and arrays whose DLPack device is the CPU (a CPU torch tensor)."""
    if isinstance(data, np.ndarray):
        return True
    device = getattr(data, "__dlpack_device__", None)
    try:
        return device is not None and int(device()[0]) == 1  # kDLCPU
    except Exception:  # an array type whose DLPack export refuses: not known to be on the host
        return False
