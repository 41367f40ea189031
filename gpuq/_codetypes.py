"""The one table of code dtypes: a row per code dtype, read by every layer.

A row says everything the layers above the backends need to know about a code dtype, so
none of them branches on a format's name or kind:

* the codec: ``"affine"`` (``q = clamp(rint(x / s) + zp, qmin, qmax)``, the integer codes)
  or ``"float8"`` (``q = float(x / s)``, rounded to nearest even: the float codes, fp8 and the
  always-saturating fp6 and fp4, whose layouts ``fp8`` names); ``bits``, ``signed`` and
  the range ``[qmin, qmax]`` (float codes: +-max_finite, 7.5 for e2m3);
* the zero-point rule: ``"int32"`` (any int32 zero point) or ``"none"`` (0 only: ONNX's fp8);
  the zero point of symmetric parameters (``symmetric_zp``: 0, 128 for uint8, 8 for uint4;
  None for float8, which has none) and the divisor of symmetric scales (``sym_divisor``:
  ``max|x| / 127``, ``/ 7``, ``/ 448``, ``/ 57344``, ``/ 6``, ``/ 7.5``, ``/ 28``);
* whether ``saturate=False`` applies (ONNX's attribute: fp8 only; fp6 and fp4 always saturate);
* the storage: ``"element"`` (one code per element, in the caller's array type: NumPy's
  int8/uint8, ml_dtypes' fp8 dtypes on the host, torch's fp8 dtypes; CuPy has no fp8, so its
  fp8 results are :class:`gpuq.Codes` of the bits) or ``"packed"`` (two codes per byte over the
  C-order flattening, ONNX's nibble order, always in a :class:`gpuq.Codes`);
* the kernels' element type (``kernel_type``, the C type the codes are stored as: fp8 bits and
  packed nibbles are bytes) and the fp8 layout's name (``fp8``: ``"e4m3fn"``, ``"e5m2"``);
* the names other libraries use: NumPy/ml_dtypes (``host_dtype``), torch, safetensors' dtype
  code of the stored tensor and ONNX's TensorProto type.

Adding a code dtype is a row here, one element operation in the kernels and the host loops
(README, "How the code is laid out", lists the places).

>>> code_type("s4").qmax, code_type("f8_e5m2").fp8, code_type("u8").symmetric_zp
(7, 'e5m2', 128)
>>> [row.name for row in CODE_TYPES.values() if row.storage == "packed"]
['int4', 'uint4', 'float4_e2m1fn']
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._dtypes import as_dtype

__all__ = ["CodeType", "CODE_TYPES", "code_type", "as_code_type", "fp8_dtype"]


class CodeType(NamedTuple):
    """One code dtype (see the module docstring for each field)."""

    name: str
    short: str
    codec: str  # "affine" | "float8"
    bits: int
    signed: bool
    qmin: float  # an int for the integer codes; 7.5 for float6_e2m3fn
    qmax: float
    zero_point: str  # "int32" | "none"
    symmetric_zp: int | None
    saturate_option: bool
    storage: str  # "element" | "packed"
    kernel_type: str
    fp8: str | None
    host_dtype: str | None
    torch: str
    safetensors: str
    onnx: str

    @property
    def sym_divisor(self) -> float:
        """``max|x|`` over this is the symmetric scale: 127, 7, 448, 57344, 6, 7.5 or 28."""
        return self.qmax if self.codec == "float8" else (self.qmax - self.qmin) // 2

    @property
    def takes_global_scale(self) -> bool:
        """NVFP4's element type (e2m1): its e4m3 block scales sit under a float32 global scale."""
        return self.name == "float4_e2m1fn"

    @property
    def torch_native(self) -> bool:
        """torch has this code dtype (fp6 codes travel as uint8 tensors, one code per byte)."""
        return self.torch == self.name

    def host_array_dtype(self) -> np.dtype:
        """The NumPy dtype of one code per element on the host (ml_dtypes' for fp8, imported
        here); packed codes have none (their bytes are uint8)."""
        if self.storage == "packed":
            raise TypeError(f"{self.name} codes are packed two per byte: no one-code dtype")
        return fp8_dtype(self.name) if self.codec == "float8" else np.dtype(self.host_dtype)

    @property
    def dtype_attribute(self):
        """How an op object states its code dtype: NumPy's dtype for the codes NumPy has
        (int8, uint8), the name for the others (NumPy has them only through ml_dtypes)."""
        return np.dtype(self.host_dtype) if self.codec == "affine" and self.storage == "element" else self.name

    def packed_size(self, n: int) -> int:
        """Elements of the stored array for ``n`` codes: n, or ceil(n / 2) bytes when packed."""
        return (n + 1) // 2 if self.storage == "packed" else n


def _row(name, short, codec, bits, signed, qmin, qmax, storage, kernel_type, fp8, host_dtype, torch,
         safetensors, onnx):
    float8 = codec == "float8"
    sym_zp = None if float8 else (0 if signed else (qmax - qmin + 1) // 2)
    return CodeType(name, short, codec, bits, signed, qmin, qmax, "none" if float8 else "int32", sym_zp,
                    float8 and bits == 8, storage, kernel_type, fp8, host_dtype, torch, safetensors, onnx)


#: Every code dtype, by name (DESIGN.md section 1; README's "Code dtypes" table).
CODE_TYPES = {row.name: row for row in (
    _row("int8", "s8", "affine", 8, True, -128, 127, "element", "signed char", None, "int8",
         "int8", "I8", "INT8"),
    _row("uint8", "u8", "affine", 8, False, 0, 255, "element", "unsigned char", None, "uint8",
         "uint8", "U8", "UINT8"),
    _row("int4", "s4", "affine", 4, True, -8, 7, "packed", "unsigned char", None, None,
         "uint8", "U8", "INT4"),
    _row("uint4", "u4", "affine", 4, False, 0, 15, "packed", "unsigned char", None, None,
         "uint8", "U8", "UINT4"),
    _row("float8_e4m3fn", "f8_e4m3", "float8", 8, True, -448, 448, "element", "unsigned char", "e4m3fn",
         "float8_e4m3fn", "float8_e4m3fn", "F8_E4M3", "FLOAT8E4M3FN"),
    _row("float8_e5m2", "f8_e5m2", "float8", 8, True, -57344, 57344, "element", "unsigned char", "e5m2",
         "float8_e5m2", "float8_e5m2", "F8_E5M2", "FLOAT8E5M2"),
    # fp4 and fp6 (OCP MX's element types): no Inf or NaN, always saturating; fp4 packs as int4.
    _row("float4_e2m1fn", "f4_e2m1", "float8", 4, True, -6, 6, "packed", "unsigned char", "e2m1fn",
         None, "uint8", "U8", "FLOAT4E2M1"),
    _row("float6_e2m3fn", "f6_e2m3", "float8", 6, True, -7.5, 7.5, "element", "unsigned char", "e2m3fn",
         "float6_e2m3fn", "uint8", "U8", "FLOAT6E2M3"),
    _row("float6_e3m2fn", "f6_e3m2", "float8", 6, True, -28, 28, "element", "unsigned char", "e3m2fn",
         "float6_e3m2fn", "uint8", "U8", "FLOAT6E3M2"),
)}
_BY_SHORT = {row.short: row for row in CODE_TYPES.values()}


def code_type(value):
    """The row of a code dtype given by name (``"int4"``, oneDNN's ``"s4"``), NumPy or ml_dtypes
    dtype or type, or a row; None for anything else (floats, unknown names).

    >>> code_type(np.int8).name, code_type("f8_e4m3").name, code_type("float32")
    ('int8', 'float8_e4m3fn', None)
    """
    if isinstance(value, CodeType):
        return value
    if value is None:  # (np.dtype(None) is float64)
        return None
    if isinstance(value, str):
        key = value.lower()
        row = CODE_TYPES.get(key) or _BY_SHORT.get(key)
        if row is not None:
            return row
    if isinstance(value, type) and value.__name__ in CODE_TYPES:  # ml_dtypes.int4, .float8_e4m3fn
        return CODE_TYPES[value.__name__]
    try:
        dt = value if isinstance(value, np.dtype) else np.dtype(value)
    except (TypeError, ValueError):
        return None
    return CODE_TYPES.get(dt.name) if dt.itemsize == 1 else None


def as_code_type(value, argname: str = "dtype") -> CodeType:
    """The row of ``value``, or an error listing every code dtype: ``ValueError`` for a name,
    ``TypeError`` for a dtype or type.

    >>> as_code_type("u4").name
    'uint4'
    >>> as_code_type("int16")
    Traceback (most recent call last):
    ...
    ValueError: dtype must be one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, got int16
    """
    row = code_type(value)
    if row is not None:
        return row
    # The word for what came is as_dtype's (an unknown name, a dtype of the wrong kind, a
    # byte order), as for every dtype argument; the list is the table's.
    try:
        as_dtype(value, argname, (np.dtype(np.int8),))
        got = repr(value)  # unreachable: int8 is a row
    except (TypeError, ValueError) as exc:
        kind, got = type(exc), str(exc).rsplit("got ", 1)[-1]
    raise kind(f"{argname} must be one of {', '.join(CODE_TYPES)}, got {got}") from None


def fp8_dtype(name: str) -> np.dtype:
    """NumPy's dtype of an fp8, fp6 or fp4 code dtype (ml_dtypes', imported here on first need).

    >>> fp8_dtype("float8_e4m3fn").itemsize             # doctest: +SKIP
    1
    """
    try:
        import ml_dtypes
    except ImportError as exc:
        raise ImportError(
            f"{name} codes on the host are ml_dtypes arrays: pip install ml_dtypes (or gpuq[cli])"
        ) from exc
    return np.dtype(getattr(ml_dtypes, name))
