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

#: Floating dtypes accepted as quantize input and dequantize output (bfloat16:
#: ml_dtypes', see the module docstring). ``FLOAT_DTYPES.names`` lists them all,
#: whatever is installed.
FLOAT_DTYPES = DtypeSet(("float16", "float32", "float64", BFLOAT16))

#: The float dtypes' (and int32's) C types the CUDA kernels are instantiated with (``__half``
#: and ``gpuq_bf16`` are 2-byte storage types of kernels/contract.cuh); the code dtypes' are
#: in their rows of :mod:`gpuq._codetypes`.
C_TYPES = {
    "int32": "int",
    "float16": "__half",
    "float32": "float",
    "float64": "double",
    BFLOAT16: "gpuq_bf16",
}

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


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
