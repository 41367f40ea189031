"""What every serving format's per-weight storage shares: the scheme of one Linear weight, the
stored scales read back, codes stored in their own dtype, and the checks of a
``quantization_config``'s names.

Each format's own storage lives in its module (:mod:`gpuq.checkpoints.formats.compressed_tensors`,
:mod:`gpuq.checkpoints.formats.fp8_blocks`): a :class:`Layout` (what one quantized weight becomes,
written and read back), its ``quantization_config`` and the reading of a folder's config back
into per-module schemes (``docs/serving-formats.md`` has the source line of each fact).

Every reader dequantizes ``(q - zp) * s`` with one float32 product rounded once to the output
dtype, which is gpuq's contract: compressed-tensors' dequantizer and ``FP8BlockDequantizer``
give the same bits (tested against them). Codes are gpuq's (``clamp(rint(x / s) + zp)``, float32
division), computed against the scale after rounding it to the dtype it is stored in
(``choose_qparams(scale_dtype=...)``), so the stored scale, zero point and codes agree.

Code types come from the rows of :mod:`gpuq._codetypes`: compressed-tensors' ``"type": "int"``
with ``num_bits`` is the signed affine row of that width (its offset-binary storage holds any
signed code), ``"type": "float"`` with 8 bits is the fp8 row stored as safetensors'
``F8_E4M3`` (compressed-tensors' FP8_E4M3_DATA; fine-grained fp8's ``"fmt": "e4m3"``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..._codetypes import CODE_TYPES
from ..files import CliError

#: The safetensors dtype of every serving fp8 weight (compressed-tensors' and fine-grained fp8's).
SERVING_FP8 = "F8_E4M3"
def int_code(bits: int):
    """The signed affine code row of ``bits`` bits (compressed-tensors' ``"type": "int"``), or None.

    >>> int_code(4).name, int_code(3)
    ('int4', None)
    """
    return next((r for r in CODE_TYPES.values() if r.codec == "affine" and r.signed and r.bits == bits), None)


def fp8_code():
    """The fp8 row the serving formats store (safetensors ``F8_E4M3``).

    >>> fp8_code().qmax
    448
    """
    return next(r for r in CODE_TYPES.values() if r.safetensors == SERVING_FP8)


@dataclass(frozen=True)
class WeightScheme:
    """How one Linear weight is stored: the code row, the strategy (``"tensor"``, ``"channel"``,
    ``"group"``, ``"block"``; ``"tensor_group"``: NVFP4's groups under a global scale), the group
    size or block shape, symmetry, the dtype of the stored scales, the layout (a
    :class:`Layout`), the scale rule (symmetric int codes: ``"full"``/``"narrow"``,
    :mod:`gpuq.checkpoints.scale_rules`; MX scales, ``scale_dtype="float8_e8m0fnu"``: an MX rule;
    None: the array API's default) and the compressed-tensors preset it comes from (None without
    one)."""

    code: object
    strategy: str
    symmetric: bool
    scale_dtype: str
    layout: object
    group_size: int | None = None
    block: tuple | None = None
    scale_rule: str | None = None
    preset: str | None = None

    def api_kwargs(self) -> dict:
        """The granularity arguments of gpuq's calls for a ``[out, in]`` weight.

        >>> WeightScheme(int_code(4), "group", True, "bfloat16", None, group_size=32).api_kwargs()
        {'axis': 1, 'group_size': 32, 'block_size': None}
        """
        axis = {"tensor": None, "channel": 0, "group": 1, "tensor_group": 1, "block": None}[self.strategy]
        return {"axis": axis, "group_size": self.group_size, "block_size": self.block}

    def qparams_kwargs(self) -> dict:
        """What :func:`gpuq.choose_qparams` takes besides the granularity: the scale rule (the
        full-range int rule or an MX rule; ``"narrow"`` is the array API's default).

        >>> WeightScheme(int_code(8), "channel", True, "bfloat16", None).qparams_kwargs()
        {}
        >>> WeightScheme(int_code(4), "group", True, "bfloat16", None, 128, scale_rule="full").qparams_kwargs()
        {'scale_rule': 'full'}
        """
        from ..scale_rules import api_kwargs

        return api_kwargs("float32", self.scale_rule)

    def scale_grid(self, shape) -> tuple:
        """The scales' stored shape for a weight of ``shape`` (compressed-tensors keeps the
        ``[out, 1]`` of a channel; one scale is ``[1]``).

        >>> WeightScheme(fp8_code(), "block", True, "float32", None, block=(128, 128)).scale_grid((144, 200))
        (2, 2)
        """
        out, n = shape
        if self.strategy == "tensor":
            return (1,)
        if self.strategy == "channel":
            return (out, 1)
        if self.strategy in ("group", "tensor_group"):
            return (out, -(-n // self.group_size))
        return (-(-out // self.block[0]), -(-n // self.block[1]))

    def api_params(self, p, shape):
        """Scales or zero points in the stored grid as gpuq takes them (None stays None).

        >>> WeightScheme(int_code(8), "channel", True, "bfloat16", None).api_params(np.ones((4, 1)), (4, 8)).shape
        (4,)
        """
        if p is None or self.strategy in ("group", "tensor_group", "block"):
            return p
        return p.reshape(()) if self.strategy == "tensor" else p.reshape(shape[0])

    def describe(self) -> str:
        """Short wording for a report row.

        >>> WeightScheme(int_code(8), "channel", True, "bfloat16", None).describe()
        'int8 sym channel'
        >>> WeightScheme(int_code(4), "group", True, "bfloat16", None, 128, scale_rule="full").describe()
        'int4 sym full-range g=128'
        """
        where = {"tensor": "per-tensor", "channel": "channel", "group": f"g={self.group_size}",
                 "tensor_group": f"g={self.group_size}",
                 "block": f"block {'x'.join(map(str, self.block or ()))}"}[self.strategy]
        sym = "" if self.code.zero_point == "none" else ("sym " if self.symmetric else "asym ")
        rule = "full-range " if self.scale_rule == "full" else ""
        scales = {"float8_e8m0fnu": f" e8m0 ({self.scale_rule or 'even'})",
                  "float8_e4m3fn": " e4m3 + global"}.get(self.scale_dtype, "")
        return f"{self.code.name} {sym}{rule}{where}{scales}"


def scale_numpy(name: str) -> np.dtype:
    from ..convert import float_dtype

    return float_dtype(name)


def scales_float32(arr, name, want_shape) -> np.ndarray:
    """Stored scales as the float32 gpuq takes (bfloat16/float16/float32 widen exactly), in the
    stored grid ``want_shape`` (one scale: any shape of one element)."""
    if arr.dtype.name not in ("bfloat16", "float16", "float32"):
        raise CliError(f"tensor {name!r} is {arr.dtype.name}: scales are bfloat16, float16 or float32")
    if arr.shape != want_shape and not (math.prod(want_shape) == 1 and arr.size == 1):
        raise CliError(f"tensor {name!r} has shape {list(arr.shape)}, expected {list(want_shape)}")
    return arr.astype(np.float32).reshape(want_shape)


class Layout:
    """How a format stores one quantized ``[out, in]`` weight of module ``M`` (a format module's
    subclass): ``params(scheme)`` (the stored names after ``M.``, the primary one first),
    ``entries(module, shape, scheme)`` (``{name: (shape, dtype)}`` of what it writes, known
    before the weight is read), ``encode(module, shape, scheme, codes, scales, zps)`` (those
    tensors from one code per element and gpuq's parameters) and ``decode(module, scheme, load)``
    (``(codes, scales, zps, shape)`` for :func:`gpuq.dequantize`, every tensor checked)."""

    #: compressed-tensors' format name (None for fine-grained fp8, which has no such field)
    name = None

    def companions(self, module: str, scheme: WeightScheme) -> list:
        """The tensors a decoder reads besides the primary one."""
        return [f"{module}.{p}" for p in self.params(scheme)[1:]]

    def primary(self, module: str, scheme: WeightScheme) -> str:
        """The stored tensor that marks the weight (its codes)."""
        return f"{module}.{self.params(scheme)[0]}"

    def dense_name(self, module: str, scheme: WeightScheme) -> str:
        """The dense weight dequantize writes in the primary tensor's place (a layout whose
        weights are not ``M.weight``, such as fused expert tensors, names its own)."""
        return f"{module}.weight"

    def shape(self, module: str, scheme: WeightScheme, load, specs) -> tuple:
        """The dense weight's shape (known before its codes are read): the stored codes' own."""
        return tuple(specs[self.primary(module, scheme)][0])

    #: Whether the layout stores a global scale per weight (shared across a merged layer's
    #: parts: :meth:`prepare`), which :meth:`encode` takes as ``global_scale=``.
    global_scale = False

    def refuses(self, shape, scheme: WeightScheme):
        """Why a ``[out, in]`` weight cannot be stored in ``scheme`` (kept in float), or None."""
        if scheme.strategy in ("group", "tensor_group") and shape[1] % scheme.group_size:
            return (f"group size {scheme.group_size} does not divide its input dimension {shape[1]} "
                    f"(compressed-tensors refuses it)")
        return None


def decode_plain(module, scheme, load, scale_param, zp_param) -> tuple:
    """Codes stored in their own dtype, scales (and unpacked zero points) beside them."""
    name = f"{module}.weight"
    codes = load(name)
    want = scheme.code.host_array_dtype()
    if codes.dtype != want or codes.ndim != 2:
        raise CliError(f"tensor {name!r} is {codes.dtype} {list(codes.shape)}, expected a 2-D {want} "
                       f"tensor ({scheme.describe()})")
    grid = scheme.scale_grid(codes.shape)
    scales = scales_float32(load(f"{module}.{scale_param}"), f"{module}.{scale_param}", grid)
    zps = None
    if zp_param is not None:
        zname = f"{module}.{zp_param}"
        zp = load(zname)
        if zp.dtype.kind not in "iu" or zp.size != math.prod(grid):
            raise CliError(f"tensor {zname!r} is {zp.dtype} {list(zp.shape)}, expected integers {list(grid)}")
        zps = zp.astype(np.int32).reshape(grid)
    return codes, scales, zps, codes.shape


def check_patterns(names: list, what: str, bad) -> None:
    """Raise ``bad(...)`` for an entry ``re:PATTERN`` of ``names`` that is no regular expression.

    >>> check_patterns(["lm_head", "re:.*gate"], "ignore", ValueError)
    >>> check_patterns(["re:("], "ignore", ValueError)
    Traceback (most recent call last):
    ...
    ValueError: ignore entry 're:(' is not a regular expression (missing ), unterminated subpattern at position 0)
    """
    for name in names:
        if name.startswith("re:"):
            try:
                re.compile(name[3:])
            except re.error as exc:
                raise bad(f"{what} entry {name!r} is not a regular expression ({exc})") from None


def is_size(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def short(obj) -> str:
    import json

    text = json.dumps(obj, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
