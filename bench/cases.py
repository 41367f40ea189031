"""Benchmark cases: one (de)quantize problem each, and the default case lists.

A :class:`Case` names an operation (``quantize``/``dequantize``, or issue 5's
``dynamic`` = ``gpuq.quantize_dynamic`` and ``qparams`` = ``gpuq.choose_qparams``
alone), a scheme
(per-tensor, per-channel on the first/middle/last axis with C channels,
multi-axis, per-group), a float dtype (the input of quantize, the output of
dequantize), a code dtype (int8/uint8), whether zero points are given, and a
target element count. :func:`Case.shape` turns the target count into a
concrete shape (the real element count may differ slightly; every rate uses
the real count).

For ``dynamic``/``qparams`` cases ``zps=False`` means ``symmetric=True``, and
the ``row`` scheme is per-token activations: ``(T, H)`` with ``H = channels``
(4096), ``axis=0``, one scale per row. Their bytes are those of the quantize
itself (see :meth:`Case.bytes_moved`), so GB/s compares with the static row
timed beside them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

#: Group size of the per-group scheme (along the last axis).
GROUP = 128
#: Last-axis length of the per-group scheme.
GROUP_ROW = 4096
#: Size of the small-tensor latency cases.
LATENCY_SIZE = 4096
#: Row length (hidden size H) of the per-token ``row`` scheme: (T, H), axis 0.
TOKEN_ROW = 4096
#: Operations whose qparams come from the data (issue 5), timed against a static quantize.
DYNAMIC_OPS = ("dynamic", "qparams")
#: Issue 5's targets: time of ``quantize_dynamic`` / time of a static quantize of the same tensor.
DYNAMIC_TARGETS = {"tensor": 2.2, "row": 1.3}
#: Issue 19's code types: packed int4/uint4 (two codes per byte) and fp8 (one byte, no zero point).
INT4_TYPES = ("int4", "uint4")
FP8_TYPES = ("float8_e4m3fn", "float8_e5m2")
FORMAT_TYPES = INT4_TYPES + FP8_TYPES
#: Short labels of the code types in case names.
QLABELS = {"int8": "s8", "uint8": "u8", "int4": "s4", "uint4": "u4", "float8_e4m3fn": "e4m3",
           "float8_e5m2": "e5m2"}
#: The int4 g128 weight of issue 19: (4096, 4096) = 16M elements in the ``group`` scheme.
WEIGHT_SIZE = 1 << 24


@dataclass(frozen=True)
class Case:
    """One benchmark problem; see the module docstring."""

    op: str  # "quantize" | "dequantize" | "dynamic" | "qparams"
    scheme: str  # "tensor" | "first" | "middle" | "last" | "axes" | "group" | "row"
    size: int
    channels: int = 1
    fdtype: str = "float32"
    qdtype: str = "int8"
    zps: bool = True
    latency: bool = False
    #: Elements between the start of the allocation and the input: a view like ``x[1:]``,
    #: whose float and code sides cannot both be 16-byte aligned at the same element.
    offset: int = 0

    @property
    def name(self) -> str:
        """A short unique label, e.g. ``q/last64/f32>s8/zp`` (``q/tensor+1/...``: the input is
        a view one element into its allocation)."""
        sch = self.scheme if self.scheme in ("tensor", "axes", "group") else f"{self.scheme}{self.channels}"
        if self.scheme == "group":
            sch = f"group{GROUP}"
        if self.offset:
            sch += f"+{self.offset}"
        f = {"float32": "f32", "float16": "f16", "float64": "f64", "bfloat16": "bf16"}[self.fdtype]
        q = QLABELS[self.qdtype]
        types = f"{f}>{q}" if self.op == "quantize" else f"{q}>{f}"
        tag = "zp" if self.zps else "sym"
        op = {"quantize": "q", "dequantize": "dq", "dynamic": "dyn", "qparams": "qp"}[self.op]
        if self.op in DYNAMIC_OPS:
            types = f"{f}>{q}"
        return f"{op}/{sch}/{types}/{tag}/{_size_label(self.size)}"

    @property
    def float_dtype(self) -> np.dtype:
        """``fdtype`` as a NumPy dtype (bfloat16: ml_dtypes', imported here; gpuq itself does not)."""
        if self.fdtype == "bfloat16":
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.fdtype)

    def shape(self) -> tuple:
        """A concrete shape of about ``size`` elements for this scheme."""
        n, c = self.size, self.channels
        if self.scheme == "tensor":
            return (max(1, n // 1024), 1024) if n >= 1024 else (n,)
        if self.scheme == "first":
            return (c, max(1, n // c))
        if self.scheme in ("last", "row"):
            return (max(1, n // c), c)
        if self.scheme == "middle":
            side = max(1, round(math.sqrt(n / c)))
            return (side, c, max(1, n // (c * side)))
        if self.scheme == "axes":
            # Two non-adjacent axes (0 and 2): the general multi-axis map.
            a, b = 16, 64
            return (a, max(1, n // (a * b)), b)
        if self.scheme == "group":
            return (max(1, n // GROUP_ROW), GROUP_ROW)
        raise ValueError(f"unknown scheme {self.scheme!r}")

    def axis(self):
        """The ``axis`` argument of gpuq for this scheme."""
        return {"tensor": None, "first": 0, "middle": 1, "last": -1, "axes": (0, 2), "group": -1,
                "row": 0}[self.scheme]

    def group_size(self):
        return GROUP if self.scheme == "group" else None

    def param_shape(self) -> tuple:
        """Shape of scales/zps as gpuq takes them."""
        shape = self.shape()
        if self.scheme == "tensor":
            return ()
        if self.scheme in ("first", "middle", "last", "row"):
            return (shape[self.axis()],)
        if self.scheme == "axes":
            return (shape[0], shape[2])
        return shape[:-1] + (-(-shape[-1] // GROUP),)

    def bcast_shape(self) -> tuple:
        """Shape of scales/zps broadcastable against the (expanded) input."""
        shape = self.shape()
        if self.scheme == "tensor":
            return (1,) * len(shape)
        if self.scheme in ("first", "middle", "last", "row"):
            k = self.axis() % len(shape)
            return tuple(d if i == k else 1 for i, d in enumerate(shape))
        if self.scheme == "axes":
            return (shape[0], 1, shape[2])
        return self.view_shape()[:-1] + (1,)  # per-group: one scale per row of the group view

    def view_shape(self) -> tuple:
        """The shape peers see: per-group splits the last axis into (groups, GROUP)."""
        shape = self.shape()
        if self.scheme == "group":
            return shape[:-1] + (shape[-1] // GROUP, GROUP)
        return shape

    def numel(self) -> int:
        return math.prod(self.shape())

    @property
    def is_format(self) -> bool:
        """Issue 19's code types (packed int4/uint4, fp8): outputs are compared bit for bit."""
        return self.qdtype in FORMAT_TYPES

    def code_nbytes(self) -> int:
        """Bytes of the code tensor: one per code, int4/uint4 packed two per byte (ceil(n / 2))."""
        n = self.numel()
        return (n + 1) // 2 if self.qdtype in INT4_TYPES else n * np.dtype(self.qdtype).itemsize

    def param_count(self) -> int:
        """Number of scales (and of zps, where there are any)."""
        return math.prod(self.param_shape())

    def has_zps(self) -> bool:
        """Zero points exist: asymmetric, or (dynamic/qparams) symmetric uint8 (zp 128)."""
        return self.zps or (self.op in DYNAMIC_OPS and self.qdtype == "uint8")

    def bytes_moved(self) -> int:
        """Bytes read + written: the float tensor and the code tensor once each.

        ``dynamic``/``qparams`` cases count the bytes of the quantize itself,
        the same for every row of the case (the static quantize beside them
        included): ``x`` read once, codes written once, scales (float32) and
        zps (int32) written once. So GB/s compares across the rows of a case
        and with the static table; ``qparams`` rows, which write no codes, are
        credited the same bytes (their GB/s is "quantize bytes per second").
        """
        n = self.numel()
        moved = n * self.float_dtype.itemsize + self.code_nbytes()
        if self.op in DYNAMIC_OPS:
            moved += self.param_count() * (4 + (4 if self.has_zps() else 0))
        return moved

    def target(self):
        """Issue 5's ratio target (dynamic time / static time), or None."""
        return DYNAMIC_TARGETS.get(self.scheme) if self.op == "dynamic" else None


def _size_label(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864; plain integers pass through."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in mult:
        return int(float(text[:-1]) * mult[text[-1]])
    return int(text)


def _channel_cases(op, size, fdtype="float32", qdtype="int8", zps=True, channels=(3, 64, 4096)):
    return [Case(op, pos, size, c, fdtype, qdtype, zps) for pos in ("first", "middle", "last") for c in channels]


def dynamic_cases(size: int) -> list:
    """Issue 5: qparams from data, each case timed against a static quantize of the same tensor.

    ``quantize_dynamic`` per-tensor (int8, and uint8 = ONNX DynamicQuantizeLinear),
    per-row (per-token (T, 4096), axis 0; asymmetric and symmetric as vLLM's
    dynamic int8), per-group 128 along the last axis; ``choose_qparams`` alone
    for the same three schemes.
    """
    return [
        Case("dynamic", "tensor", size),
        Case("dynamic", "tensor", size, qdtype="uint8"),
        Case("dynamic", "row", size, TOKEN_ROW),
        Case("dynamic", "row", size, TOKEN_ROW, zps=False),
        Case("dynamic", "group", size),
        Case("qparams", "tensor", size),
        Case("qparams", "row", size, TOKEN_ROW),
        Case("qparams", "group", size),
    ]


def format_cases(size: int) -> list:
    """Issue 19: int4 g128 weights and fp8 e4m3fn activations, quantize and dequantize.

    * int4/uint4 per-group 128 along the last axis of ``(n / 4096, 4096)`` weights:
      symmetric int4 (no zps) and uint4 with zps, at the ``(4096, 4096)`` weight
      (``WEIGHT_SIZE``) and at ``size`` when that is larger (64M: ``(16384, 4096)``);
    * fp8 e4m3fn (saturating, no zero point): per-tensor activations ``(n / 1024, 1024)``
      and per-row = per-token ``(T, 4096)`` with ``axis=0``, at ``size``.

    Peers: onnxruntime opset 21 (``block_size=128``; ``saturate=1``) on the CPU, ml_dtypes'
    ``astype`` for fp8, naive NumPy + nibble packing for int4; torch on the GPU
    (``bench.gpu_formats``).
    """
    cases = []
    for n in sorted({WEIGHT_SIZE, max(size, WEIGHT_SIZE)}) if size >= WEIGHT_SIZE else [size]:
        for op in ("quantize", "dequantize"):
            cases.append(Case(op, "group", n, qdtype="int4", zps=False))
            cases.append(Case(op, "group", n, qdtype="uint4", zps=True))
    for op in ("quantize", "dequantize"):
        cases.append(Case(op, "tensor", size, qdtype="float8_e4m3fn", zps=False))
        cases.append(Case(op, "row", size, TOKEN_ROW, qdtype="float8_e4m3fn", zps=False))
    return cases


def full_cases(size: int) -> list:
    """The full set at one size (the GPU default): every scheme, all ops, both code types."""
    cases = []
    for op in ("quantize", "dequantize"):
        for qd, zp in itertools.product(("int8", "uint8"), (True, False)):
            cases.append(Case(op, "tensor", size, 1, "float32", qd, zp))
        cases += _channel_cases(op, size)
        cases.append(Case(op, "axes", size))
        cases.append(Case(op, "group", size))
        cases.append(Case(op, "tensor", size, fdtype="float16"))
        cases.append(Case(op, "last", size, 64, fdtype="float16"))
        cases.append(Case(op, "last", size, 64, qdtype="uint8"))
        cases.append(Case(op, "last", size, 64, zps=False))
        cases.append(Case(op, "tensor", size, offset=1))  # an unaligned view: scalar code side
    return cases + dynamic_cases(size)


def cpu_default_cases(size: int) -> list:
    """The CPU default: a subset that runs in a few minutes on 2 cores.

    Every scheme and every per-channel axis at C=64 (first, middle, last),
    plus the collapse-prone shapes (C=3 first and last, C=4096 last and middle),
    uint8, symmetric, float16 and bfloat16 on per-tensor; both ops; every
    :func:`dynamic_cases` case and every :func:`format_cases` case (issue 19). The bfloat16 rows sit beside the float32 rows of
    the same element count (``--cases f32>s8/zp,bf16>s8/zp``; target: bfloat16
    quantize within 1.2x of float32, bench/NOTES.md).
    """
    cases = []
    for op in ("quantize", "dequantize"):
        cases += [
            Case(op, "tensor", size),
            Case(op, "tensor", size, zps=False),
            Case(op, "tensor", size, qdtype="uint8"),
            Case(op, "tensor", size, fdtype="float16"),
            Case(op, "tensor", size, fdtype="bfloat16"),
            Case(op, "last", size, 64, fdtype="bfloat16"),
            Case(op, "first", size, 3),
            Case(op, "first", size, 64),
            Case(op, "middle", size, 64),
            Case(op, "middle", size, 4096),
            Case(op, "last", size, 3),
            Case(op, "last", size, 64),
            Case(op, "last", size, 4096),
            Case(op, "axes", size),
            Case(op, "group", size),
        ]
    return cases + dynamic_cases(size) + format_cases(size)


def latency_cases() -> list:
    """Small tensors: per-call wall time, Python dispatch included."""
    n = LATENCY_SIZE
    return [
        Case("quantize", "tensor", n, latency=True),
        Case("quantize", "last", n, 64, latency=True),
        Case("dequantize", "tensor", n, latency=True),
        Case("dequantize", "last", n, 64, latency=True),
    ]


def quick_cases() -> list:
    """A seconds-long smoke set (tests): a few schemes at 256K elements, one latency case,
    the three issue-5 schemes (dynamic; qparams alone on rows) and issue 19's formats."""
    n = 1 << 18
    return [
        Case("quantize", "tensor", n),
        Case("quantize", "tensor", n, offset=1),
        Case("quantize", "last", n, 64),
        Case("quantize", "group", n),
        Case("dequantize", "tensor", n),
        Case("dequantize", "first", n, 3, qdtype="uint8"),
        Case("dynamic", "tensor", n, qdtype="uint8"),
        Case("dynamic", "row", n, TOKEN_ROW),
        Case("dynamic", "group", n),
        Case("qparams", "row", n, TOKEN_ROW),
        Case("quantize", "tensor", LATENCY_SIZE, latency=True),
    ] + format_cases(n)


def with_size(cases, size):
    return [replace(c, size=size) if not c.latency else c for c in cases]
