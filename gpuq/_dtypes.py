"""The dtypes gpuq speaks, their names, ranges and C spellings (one table)."""

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
}

#: Quantized (code) dtypes and their saturation range [qmin, qmax].
QUANT_RANGE = {
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint8): (0, 255),
}

#: Floating dtypes accepted as quantize input and dequantize output.
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

#: The one dtype -> C type table the CUDA kernels are instantiated from.
C_TYPES = {
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int32): "int",
    np.dtype(np.float16): "__half",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def as_dtype(value, argname: str, allowed) -> np.dtype:
    """Normalise a dtype given as a NumPy dtype, type or name (``"s8"`` too).

    Raises ``ValueError`` for an unknown name and ``TypeError`` for a known
    dtype outside ``allowed``.
    """
    if isinstance(value, str):
        name = _SHORT_NAMES.get(value.lower(), value)
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
    if dt not in allowed:
        exc = ValueError if isinstance(value, str) else TypeError
        raise exc(f"{argname} must be one of {_names(allowed)}, got {dt.name}")
    return dt


def compute_dtype(float_dtype: np.dtype) -> np.dtype:
    """The arithmetic dtype for a float input/output: float64 stays, others are float32."""
    return np.dtype(np.float64) if float_dtype == np.float64 else np.dtype(np.float32)


def _names(dtypes) -> str:
    return ", ".join(np.dtype(d).name for d in dtypes)
