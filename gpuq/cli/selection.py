"""Which tensors ``gpuq quantize`` quantizes, and with which scheme.

A tensor is quantized when all of these hold (the rest are copied bit for bit):

- its dtype is floating: float16, bfloat16, float32 or float64;
- its rank is >= 2 (1-D biases and norm weights stay in float);
- it has at least ``--min-size`` elements (default :data:`DEFAULT_MIN_SIZE`);
- its name matches one ``--include`` glob (if any are given) and no ``--exclude`` glob.

Globs are shell-style (:func:`fnmatch.fnmatchcase`): ``*`` also matches dots,
so ``'*.mlp.*'`` picks every MLP weight. Every pattern must match at least one
tensor name, which catches typos.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

from .files import CliError
from .quantized import FP8_DTYPES, scheme_for

DEFAULT_MIN_SIZE = 1024
_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Plan:
    """The scheme asked for on the command line (``axis`` as given, may be negative).

    ``axis=None`` with ``group_size=None`` is per-tensor.
    """

    axis: int | None
    group_size: int | None
    dtype: str
    symmetric: bool

    def for_shape(self, name: str, shape: tuple) -> dict:
        """This plan for one tensor: the ``axis`` normalised to ``[0, rank)``.

        >>> Plan(-1, 128, "int8", True).for_shape("w", (4, 256))
        {'dtype': 'int8', 'symmetric': True, 'axis': 1, 'group_size': 128}

        int4/uint4 schemes also record the shape and packing, fp8 ones are
        symmetric (:func:`gpuq.cli.quantized.scheme_for`).
        """
        axis = self.axis
        if axis is not None:
            rank = len(shape)
            if not -rank <= axis < rank:
                raise CliError(
                    f"--axis {axis} is out of range for tensor {name!r} of shape {shape} "
                    f"(rank {rank}); exclude it or pick an axis every selected tensor has"
                )
            axis %= rank
        return scheme_for(self.dtype, self.symmetric, axis, self.group_size, shape)


def describe(scheme: dict) -> str:
    """Short wording for a report row.

    >>> describe({"dtype": "int8", "symmetric": False, "axis": 1, "group_size": 128})
    'int8 asym axis=1 g=128'
    >>> describe({"dtype": "uint8", "symmetric": True, "axis": None, "group_size": None})
    'uint8 sym per-tensor'
    >>> describe({"dtype": "float8_e4m3fn", "symmetric": True, "axis": 0, "group_size": None})
    'float8_e4m3fn axis=0'
    """
    parts = [scheme["dtype"]]
    if scheme["dtype"] not in FP8_DTYPES:  # fp8 is always symmetric: no word for it
        parts.append("sym" if scheme["symmetric"] else "asym")
    if scheme["axis"] is None:
        parts.append("per-tensor")
    else:
        parts.append(f"axis={scheme['axis']}")
    if scheme["group_size"] is not None:
        parts.append(f"g={scheme['group_size']}")
    return " ".join(parts)


def is_float(dtype) -> bool:
    """True for the dtypes gpuq quantizes (bfloat16 included, through ml_dtypes)."""
    return isinstance(dtype, np.dtype) and dtype.name in _FLOAT_NAMES


def select(specs: dict, *, include=(), exclude=(), min_size=DEFAULT_MIN_SIZE) -> list:
    """Names (in file order) of the tensors to quantize; ``specs`` maps name -> (shape, dtype).

    >>> specs = {"a.weight": ((64, 64), np.dtype("float32")), "a.bias": ((64,), np.dtype("float32"))}
    >>> select(specs)
    ['a.weight']
    >>> select(specs, include=["b.*"])
    Traceback (most recent call last):
    ...
    gpuq.cli.files.CliError: --include 'b.*' matches no tensor name in IN
    """
    names = list(specs)
    for flag, patterns in (("--include", include), ("--exclude", exclude)):
        for pat in patterns:
            if not any(fnmatch.fnmatchcase(n, pat) for n in names):
                raise CliError(f"{flag} {pat!r} matches no tensor name in IN")
    chosen = []
    for name in names:
        shape, dtype = specs[name]
        if not is_float(dtype) or len(shape) < 2 or int(np.prod(shape)) < min_size:
            continue
        if include and not any(fnmatch.fnmatchcase(name, p) for p in include):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in exclude):
            continue
        chosen.append(name)
    if not chosen:
        raise CliError(
            f"no tensor to quantize: none of the {len(names)} tensors in IN is floating, "
            f"rank >= 2, with >= {min_size} elements (--min-size) and matched by the patterns"
        )
    return chosen


def check_names(names, chosen) -> None:
    """Refuse an IN where ``<name>.scales`` / ``<name>.zps`` would overwrite a tensor."""
    existing = set(names)
    for name in chosen:
        for suffix in (".scales", ".zps"):
            if name + suffix in existing:
                raise CliError(
                    f"tensor {name!r} cannot be quantized: IN already has a tensor named "
                    f"{name + suffix!r}, where its {suffix[1:]} would go"
                )
