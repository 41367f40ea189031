"""The dtypes gpuq speaks, their names, ranges and C spellings (one table).

bfloat16 is NumPy's only through a package that registers it (``ml_dtypes``,
which JAX and TensorFlow use). gpuq's core install is NumPy only, so bfloat16
is recognised by its dtype's name and layout (:func:`is_bfloat16`) without
importing anything, and ``ml_dtypes`` is imported only where gpuq must create
a bfloat16 dtype itself (``dequantize(dtype="bfloat16")``: :func:`bfloat16`).
The kernel table (:data:`C_TYPES`) is keyed by dtype name for that reason: the
CUDA instantiations are the same whether ``ml_dtypes`` is installed or not.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# oneDNN Graph short names beside the NumPy ones.
_SHORT_NAMES = {
    "s8": "int8",
    "u8": "uint8",
    "s32": "int32",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
    "s4": "int4",
    "u4": "uint4",
    "f8_e4m3": "float8_e4m3fn",
    "f8_e5m2": "float8_e5m2",
}

#: The name of the bfloat16 dtype (ml_dtypes, JAX, TensorFlow all use it).
BFLOAT16 = "bfloat16"


def is_bfloat16(dt) -> bool:
    """Whether ``dt`` is a bfloat16 dtype (ml_dtypes'), recognised without importing ml_dtypes.

    A registered 2-byte type named ``bfloat16`` (kind ``"V"``, as ml_dtypes
    declares it); a plain 2-byte void (``"V2"``) is not one.

    >>> is_bfloat16(np.dtype(np.float16)), is_bfloat16(np.dtype("V2"))
    (False, False)
    """
    return isinstance(dt, np.dtype) and dt.kind == "V" and dt.itemsize == 2 and dt.name == BFLOAT16


def bfloat16() -> np.dtype:
    """NumPy's bfloat16 dtype, from ``ml_dtypes`` (imported here, on first need only).

    Raises ``ImportError`` saying what to install where ml_dtypes is missing.

    >>> bfloat16().name                                  # doctest: +SKIP
    'bfloat16'
    """
    try:
        import ml_dtypes
    except ImportError as exc:
        raise ImportError(
            "bfloat16 needs the ml_dtypes package (pip install ml_dtypes, or gpuq[cli]): "
            "NumPy has no bfloat16 of its own"
        ) from exc
    return np.dtype(ml_dtypes.bfloat16)


class DtypeSet:
    """An ordered set of dtypes, by name, whose membership test needs no import.

    ``dt in s`` compares names (a bfloat16 dtype is recognised by
    :func:`is_bfloat16`); ``s.names`` are the names in order; iterating gives
    the NumPy dtypes, bfloat16 included where ``ml_dtypes`` imports (it is
    imported then, not before) and left out where it does not.

    >>> s = DtypeSet(("float32", "bfloat16"))
    >>> np.dtype(np.float32) in s, np.dtype(np.float64) in s, "bfloat16" in s.names
    (True, False, True)
    """

    def __init__(self, names):
        self.names = tuple(names)

    def __contains__(self, dt) -> bool:
        return isinstance(dt, np.dtype) and dtype_name(dt) in self.names

    def __iter__(self):
        for name in self.names:
            if name != BFLOAT16:
                yield np.dtype(name)
                continue
            try:
                yield bfloat16()
            except ImportError:
                pass

    def __len__(self) -> int:
        return len(tuple(iter(self)))

    def __repr__(self) -> str:
        return f"DtypeSet({self.names!r})"


def dtype_name(dt) -> str:
    """The table key of a dtype or dtype name: ``"bfloat16"``, or NumPy's native name.

    >>> dtype_name(np.dtype(">f4")), dtype_name("bfloat16"), dtype_name(np.int8)
    ('float32', 'bfloat16', 'int8')
    """
    if isinstance(dt, str) and _SHORT_NAMES.get(dt.lower(), dt) == BFLOAT16:
        return BFLOAT16
    dt = np.dtype(dt)
    return BFLOAT16 if is_bfloat16(dt) else native(dt).name

#: Quantized (code) dtypes and their saturation range [qmin, qmax].
QUANT_RANGE = {
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint8): (0, 255),
}

#: Floating dtypes accepted as quantize input and dequantize output (bfloat16:
#: ml_dtypes', see the module docstring). ``FLOAT_DTYPES.names`` lists them all,
#: whatever is installed.
FLOAT_DTYPES = DtypeSet(("float16", "float32", "float64", BFLOAT16))

#: The one dtype name -> C type table the CUDA kernels are instantiated from
#: (``__half`` and ``gpuq_bf16`` are 2-byte storage types of kernels/contract.cuh).
C_TYPES = {
    "int8": "signed char",
    "uint8": "unsigned char",
    "int32": "int",
    "float16": "__half",
    "float32": "float",
    "float64": "double",
    BFLOAT16: "gpuq_bf16",
}

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class CodeFormat(NamedTuple):
    """A code dtype beyond NumPy's int8/uint8: how its codes are stored and their range.

    ``kind`` is ``"int4"`` (two codes per byte, ONNX's nibble order) or ``"fp8"``
    (one byte, an ml_dtypes float8 type); ``qmin``/``qmax`` the saturating range
    (fp8: +-max_finite, which is also the divisor of symmetric scales);
    ``fmt`` the kernels' name of the fp8 layout (``"e4m3fn"``/``"e5m2"``).
    """

    name: str
    kind: str
    qmin: int
    qmax: int
    signed: bool
    fmt: str | None = None


#: The code formats NumPy has no dtype for, by name (DESIGN.md section 1).
CODE_FORMATS = {
    "int4": CodeFormat("int4", "int4", -8, 7, True),
    "uint4": CodeFormat("uint4", "int4", 0, 15, False),
    "float8_e4m3fn": CodeFormat("float8_e4m3fn", "fp8", -448, 448, True, "e4m3fn"),
    "float8_e5m2": CodeFormat("float8_e5m2", "fp8", -57344, 57344, True, "e5m2"),
}
C_TYPES.update({"float8_e4m3fn": "gpuq_e4m3", "float8_e5m2": "gpuq_e5m2"})


def code_format(value):
    """The :class:`CodeFormat` of a dtype or name (``"int4"``, ``"s4"``, ml_dtypes' fp8 dtype),
    or None for anything else (int8, uint8, unknown names).

    >>> code_format("u4").qmax, code_format("f8_e5m2").fmt, code_format("int8")
    (15, 'e5m2', None)
    """
    if isinstance(value, CodeFormat):
        return value
    if isinstance(value, str):
        return CODE_FORMATS.get(_SHORT_NAMES.get(value.lower(), value))
    if isinstance(value, np.dtype) and value.kind in "fV" and value.itemsize == 1:
        return CODE_FORMATS.get(value.name)
    if isinstance(value, type) and value.__name__ in CODE_FORMATS:  # ml_dtypes.float8_e4m3fn
        return CODE_FORMATS[value.__name__]
    return None


def as_code_dtype(value, argname: str = "dtype"):
    """A code dtype: the :class:`CodeFormat` of int4/uint4/fp8, or NumPy's int8/uint8.

    Errors list every code dtype (``ValueError`` for names, ``TypeError`` for dtypes).

    >>> as_code_dtype("s4").name, as_code_dtype("u8")
    ('int4', dtype('uint8'))
    """
    fmt = code_format(value)
    if fmt is not None:
        return fmt
    try:
        return as_dtype(value, argname, tuple(QUANT_RANGE))
    except (TypeError, ValueError) as exc:
        names = ", ".join(("int8", "uint8", *CODE_FORMATS))
        got = str(exc).rsplit("got ", 1)[-1]  # as_dtype's word for what came
        raise type(exc)(f"{argname} must be one of {names}, got {got}") from None


def fp8_dtype(name: str) -> np.dtype:
    """NumPy's dtype of an fp8 format (ml_dtypes', imported here on first need).

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


def native(dt: np.dtype) -> np.dtype:
    """``dt`` in native byte order (the same type: ``>f4`` -> ``float32``).

    >>> native(np.dtype(">f4")) == np.float32, native(np.dtype(np.int8)) == np.int8
    (True, True)
    """
    return dt if dt.isnative else dt.newbyteorder("=")


def as_dtype(value, argname: str, allowed, *, any_byte_order: bool = False) -> np.dtype:
    """Normalise a dtype given as a NumPy dtype, type or name (``"s8"`` too).

    Raises ``ValueError`` for an unknown name and ``TypeError`` for a known
    dtype outside ``allowed``. A dtype argument selects the type, not the byte
    order (results are native, as NumPy's ufuncs make them): a non-native one
    (``">f4"``) is a ``TypeError``, unless ``any_byte_order`` (the dtype of a
    caller's array, ``out.dtype``), where it stands for its native twin.
    """
    if isinstance(value, str):
        name = _SHORT_NAMES.get(value.lower(), value)
        if name == BFLOAT16:
            # Named by a string, bfloat16 must be created (ml_dtypes imported): only where allowed.
            if BFLOAT16 not in _names_of(allowed):
                raise ValueError(f"{argname} must be one of {_names(allowed)}, got {value!r}")
            return bfloat16()
        try:
            dt = np.dtype(name)
        except TypeError:
            raise ValueError(
                f"{argname} must be one of {_names(allowed)}, got unknown name {value!r}"
            ) from None
    else:
        try:
            dt = np.dtype(value)
        except TypeError:
            raise TypeError(
                f"{argname} must be a dtype or dtype name, one of {_names(allowed)}; "
                f"got {value!r}"
            ) from None
    if not dt.isnative:
        if not any_byte_order:
            raise TypeError(
                f"{argname} selects the type, not the byte order (results are native): got "
                f"{dt.str}; pass {native(dt).name}, or out= an array in the byte order you need"
            )
        dt = native(dt)
    if dt not in allowed:
        exc = ValueError if isinstance(value, str) else TypeError
        raise exc(f"{argname} must be one of {_names(allowed)}, got {dt.name}")
    return dt


def compute_dtype(float_dtype) -> np.dtype:
    """The arithmetic dtype for a float input/output (a dtype or its name): float64 stays,
    others (float16, float32, bfloat16) are float32.

    >>> compute_dtype(np.dtype(np.float16)), compute_dtype("bfloat16"), compute_dtype("float64")
    (dtype('float32'), dtype('float32'), dtype('float64'))
    """
    return np.dtype(np.float64) if dtype_name(float_dtype) == "float64" else np.dtype(np.float32)


def _names_of(dtypes) -> tuple:
    return dtypes.names if isinstance(dtypes, DtypeSet) else tuple(dtype_name(d) for d in dtypes)


def _names(dtypes) -> str:
    return ", ".join(_names_of(dtypes))
