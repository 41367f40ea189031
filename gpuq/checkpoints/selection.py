"""Which tensors ``gpuq quantize`` quantizes, and with which scheme.

A tensor is quantized when all of these hold (the rest are copied bit for bit):

- its dtype is floating: float16, bfloat16, float32 or float64;
- its rank is >= 2 (1-D biases and norm weights stay in float);
- it has at least ``--min-size`` elements (default :data:`DEFAULT_MIN_SIZE`);
- its name matches one ``--include`` glob (if any are given) and no ``--exclude`` glob.

Globs are shell-style (:func:`fnmatch.fnmatchcase`): ``*`` also matches dots,
so ``'*.mlp.*'`` picks every MLP weight. Every pattern must match at least one
tensor name, which catches typos.

The scheme is the one asked for (``--axis``, ``--per-tensor``, ``--group-size``)
or, when none of them is given, the default of the code type and the tensor's
rank (:func:`default_scheme`, worded in :data:`DEFAULTS_HELP`): one scale per
row of the last dimension for int8/uint8/fp8 (axis 0 of a rank-2 ``[out, in]``
weight; every leading axis of an ``[experts, out, in]`` one, so each expert's
rows get their own scales), groups of :data:`DEFAULT_GROUP` along the last
dimension for int4/uint4, as every int4 consumer stores them; groups of :data:`MX_GROUP` (32,
OCP MX's block) for fp4/fp6 and any ``--scales mx``, of :data:`NVFP4_GROUP` (16) for ``--scales
nvfp4``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

from .files import CliError
from .quantized import is_float8, is_packed, scheme_for
from .scale_rules import is_small_float, scheme_keys, word

DEFAULT_MIN_SIZE = 1024
_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
#: The group size of the int4/uint4 default.
DEFAULT_GROUP = 128
#: The group sizes of the fp4/fp6 default (OCP MX's block of 32) and of NVFP4's scales (16).
MX_GROUP, NVFP4_GROUP = 32, 16
#: The defaults table, as ``gpuq quantize --help`` states it.
DEFAULTS_HELP = f"""\
  code type            rank 2 ([out, in])             rank >= 3 ([experts, out, in], ...)
  int8, uint8, fp8     one scale per output channel   one scale per row of the last
                       (axis 0)                       dimension (axes 0 .. rank-2)
  int4, uint4          groups of {DEFAULT_GROUP} along the last dimension, at every rank (one
                       group per row where that dimension is shorter than {DEFAULT_GROUP})
  fp4, fp6; --scales   groups of {MX_GROUP} along the last dimension, at every rank; --scales
  mx with fp8          nvfp4: groups of {NVFP4_GROUP}"""


def default_scheme(dtype: str, rank: int, scales: str = "float32") -> tuple:
    """``(axis, group_size)`` of the default scheme (no --axis, --per-tensor, --group-size).

    A list of axes is the multi-axis scheme: one scale per element of the
    tensor's shape projected onto them. ``scales`` is ``--scales``: MX scales (the fp4/fp6
    default) run over groups of 32 along the last dimension, NVFP4's over groups of 16.

    >>> default_scheme("int8", 2), default_scheme("float8_e4m3fn", 3), default_scheme("uint4", 3)
    ((0, None), ([0, 1], None), (2, 128))
    >>> default_scheme("float4_e2m1fn", 2), default_scheme("float4_e2m1fn", 3, "nvfp4")
    ((1, 32), (2, 16))
    """
    if scales == "nvfp4":
        return rank - 1, NVFP4_GROUP
    if scales == "mx" or is_small_float(dtype):
        return rank - 1, MX_GROUP
    if is_packed(dtype):
        return rank - 1, DEFAULT_GROUP
    if rank <= 2:
        return 0, None
    return list(range(rank - 1)), None


def default_note(dtype: str, scales: str = "float32") -> str:
    """The report's line on the defaults, for one code type (and ``--scales``).

    >>> default_note("int4"), default_note("float4_e2m1fn", "mx")
    ('int4: groups of 128 along the last dimension', 'float4_e2m1fn: groups of 32 along the last dimension')
    """
    if scales != "float32" or is_small_float(dtype) or is_packed(dtype):
        return f"{dtype}: groups of {default_scheme(dtype, 2, scales)[1]} along the last dimension"
    return (f"{dtype}: one scale per output channel at rank 2, per row of the last dimension "
            f"at rank >= 3")


@dataclass(frozen=True)
class Plan:
    """The scheme asked for on the command line (``axis`` as given, may be negative).

    ``axis=None`` with ``group_size=None`` is per-tensor; ``default=True`` (none
    of --axis, --per-tensor, --group-size given) is the defaults table, by rank
    (:func:`default_scheme`; ``axis`` and ``group_size`` are then not used).
    ``scales`` and ``scale_rule`` are resolved (:func:`gpuq.checkpoints.scale_rules.resolve`).
    """

    axis: int | None
    group_size: int | None
    dtype: str
    symmetric: bool
    default: bool = False
    block: tuple | None = None  # --block AxB: blocks of the last two dims (1 on leading dims)
    scales: str = "float32"  # --scales: float32, mx or nvfp4
    scale_rule: str | None = None  # full/narrow (symmetric int codes), an MX rule, or None

    def for_shape(self, name: str, shape: tuple) -> dict:
        """This plan for one tensor (:meth:`_where`), with its scale keys
        (:func:`gpuq.checkpoints.scale_rules.scheme_keys`).

        >>> Plan(None, None, "int4", True, default=True, scale_rule="full").for_shape("w", (4, 256))["scale_rule"]
        'full'
        """
        return {**self._where(name, shape), **scheme_keys(self.dtype, self.scales, self.scale_rule)}

    def _where(self, name: str, shape: tuple) -> dict:
        """This plan for one tensor: the ``axis`` normalised to ``[0, rank)``.

        >>> Plan(-1, 128, "int8", True).for_shape("w", (4, 256))
        {'dtype': 'int8', 'symmetric': True, 'axis': 1, 'group_size': 128}

        int4/uint4 schemes also record the shape and packing, fp8 ones are
        symmetric (:func:`gpuq.checkpoints.quantized.scheme_for`). A default plan takes
        the table's scheme for the tensor's rank:

        >>> Plan(None, None, "int8", False, default=True).for_shape("w", (8, 4, 256))["axis"]
        [0, 1]
        """
        if self.default:
            axis, group = default_scheme(self.dtype, len(shape), self.scales)
            return scheme_for(self.dtype, self.symmetric, axis, group, shape)
        if self.block is not None:
            return scheme_for(self.dtype, self.symmetric, None, None, shape,
                              block_size=block_for_rank(self.block, len(shape)))
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


#: The largest ``--block`` size: the API's sizes are int32 on the GPU, and a larger one would be
#: written into the file's metadata as given (-1, or the dimension's size, covers it whole).
MAX_BLOCK = 2**31


def parse_block(text: str, where: str) -> tuple:
    """``AxB`` (``--block``, a ``bAxB`` scheme option) as ``(A, B)``: two integers from 1 to
    :data:`MAX_BLOCK`, or -1 for the whole dimension (as the API's ``block_size`` takes).

    >>> parse_block("128x128", "--block"), parse_block("64X32", "--block"), parse_block("-1x128", "--block")
    ((128, 128), (64, 32), (-1, 128))
    """
    parts = text.lower().split("x")
    # ASCII digits only: str.isdigit also takes '²' (which int() refuses) and '４'
    sizes = [-1 if p.strip() == "-1" else int(p) if p.strip().isascii() and p.strip().isdigit()
             and int(p) >= 1 else None for p in parts]
    if len(sizes) != 2 or None in sizes:
        raise CliError(f"{where} must be AxB, two positive integers or -1 for a whole dimension (e.g. "
                       f"128x128, -1x128), got {text!r}")
    if max(sizes) > MAX_BLOCK:
        raise CliError(f"{where} {text}: a block size is at most 2**31 ({MAX_BLOCK}); -1 takes a whole "
                       f"dimension")
    return tuple(sizes)


def block_for_rank(block: tuple, rank: int) -> list:
    """``--block AxB`` for a tensor of ``rank``: ``[A, B]`` on its last two dims, 1 on the
    leading ones (an expert of a ``[experts, out, in]`` tensor never shares a block with
    another); a rank-1 tensor takes ``[B]``, a 0-d one ``[]``.

    >>> block_for_rank((128, 128), 3), block_for_rank((128, 64), 1), block_for_rank((8, 8), 2)
    ([1, 128, 128], [64], [8, 8])
    """
    tail = list(block)[-rank:] if rank else []
    return [1] * (rank - len(tail)) + tail


def describe(scheme: dict) -> str:
    """Short wording for a report row.

    >>> describe({"dtype": "int8", "symmetric": False, "axis": 1, "group_size": 128})
    'int8 asym axis=1 g=128'
    >>> describe({"dtype": "uint8", "symmetric": True, "axis": None, "group_size": None})
    'uint8 sym per-tensor'
    >>> describe({"dtype": "float8_e4m3fn", "symmetric": True, "axis": [0, 1], "group_size": None})
    'float8_e4m3fn axis=(0,1)'
    >>> describe({"dtype": "int4", "symmetric": True, "axis": 1, "group_size": 128, "scale_rule": "full"})
    'int4 sym full-range axis=1 g=128'
    """
    parts = [scheme["dtype"]]
    if not is_float8(scheme["dtype"]):  # fp8 is always symmetric: no word for it
        parts.append("sym" if scheme["symmetric"] else "asym")
    rule = word(scheme.get("scale_dtype", "float32"), scheme.get("scale_rule"))
    return " ".join(parts + ([rule] if rule else []) + [describe_where(scheme)])


def describe_where(scheme: dict) -> str:
    """The granularity part of :func:`describe`.

    >>> describe_where({"axis": [0, 1, 2], "group_size": None}), describe_where({"axis": 1, "group_size": 32})
    ('axis=(0,1,2)', 'axis=1 g=32')
    """
    block = scheme.get("block_size")
    if block is not None:
        return "block=" + "x".join(map(str, block))
    axis = scheme["axis"]
    if axis is None:
        return "per-tensor"
    where = f"axis=({','.join(map(str, axis))})" if isinstance(axis, list) else f"axis={axis}"
    if scheme["group_size"] is not None:
        where += f" g={scheme['group_size']}"
    return where


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
    gpuq.checkpoints.files.CliError: --include 'b.*' matches no tensor name in IN
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


def check_names(names, chosen, suffixes=(".scales", ".zps")) -> None:
    """Refuse an IN where ``<name>.scales`` / ``<name>.zps`` (or another of ``suffixes``: NVFP4's
    ``.global_scale``) would overwrite a tensor."""
    existing = set(names)
    for name in chosen:
        for suffix in suffixes:
            if name + suffix in existing:
                raise CliError(
                    f"tensor {name!r} cannot be quantized: IN already has a tensor named "
                    f"{name + suffix!r}, where its {suffix[1:]} would go"
                )
