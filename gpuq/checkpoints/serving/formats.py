"""What the serving formats store for one Linear weight, and their ``quantization_config``.

For a quantized Linear ``M`` (``docs/serving-formats.md`` has the source line of each fact):

====================  ==========================================================================
layout                tensors
====================  ==========================================================================
pack-quantized        ``M.weight_packed`` int32 ``[out, ceil(in * bits / 32)]`` (:mod:`.packing`),
(compressed-tensors,  ``M.weight_scale`` ``[out, 1]`` (channel) or ``[out, in / G]`` (group) in
int codes)            the scale dtype, ``M.weight_shape`` int64 ``[out, in]``, and when asymmetric
                      ``M.weight_zero_point`` int32 packed down the output dimension
                      ``[ceil(out * bits / 32), 1 or in / G]``
naive-quantized,      ``M.weight`` in the code dtype (F8_E4M3 for fp8, I8 for int8), ``M.weight_scale``
float-quantized,      ``[1]`` (tensor), ``[out, 1]``, ``[out, in / G]`` or ``[ceil(out / b0), ceil(in / b1)]``
int-quantized         (block), and when asymmetric an unpacked ``M.weight_zero_point`` of that shape
fine-grained fp8      ``M.weight`` F8_E4M3, ``M.weight_scale_inv`` float32 ``[ceil(out / 128), ceil(in / 128)]``:
(DeepSeek-V3,         the scale of each 128 x 128 block (ragged at the edges), multiplied on dequantize
Qwen3-FP8)
====================  ==========================================================================

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
from .packing import pack_rows, unpack_rows, words_per_row

#: The safetensors dtype of every serving fp8 weight (compressed-tensors' and fine-grained fp8's).
SERVING_FP8 = "F8_E4M3"
#: The compressed-tensors version whose format gpuq writes and reads (its config's "version").
CT_VERSION = "0.20.0"
#: The one block shape of fine-grained fp8 that gpuq writes (DeepSeek-V3's, Qwen3-FP8's).
FP8_BLOCK = (128, 128)


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


def ct_type(code) -> str:
    """compressed-tensors' ``"type"`` of a code row.

    >>> ct_type(int_code(4)), ct_type(fp8_code())
    ('int', 'float')
    """
    return "float" if code.codec == "float8" else "int"


@dataclass(frozen=True)
class WeightScheme:
    """How one Linear weight is stored: the code row, the strategy (``"tensor"``, ``"channel"``,
    ``"group"``, ``"block"``), the group size or block shape, symmetry, the dtype of the stored
    scales, and the layout (one of :data:`LAYOUTS`' values)."""

    code: object
    strategy: str
    symmetric: bool
    scale_dtype: str
    layout: object
    group_size: int | None = None
    block: tuple | None = None

    def api_kwargs(self) -> dict:
        """The granularity arguments of gpuq's calls for a ``[out, in]`` weight.

        >>> WeightScheme(int_code(4), "group", True, "bfloat16", PACK, group_size=32).api_kwargs()
        {'axis': 1, 'group_size': 32, 'block_size': None}
        """
        axis = {"tensor": None, "channel": 0, "group": 1, "block": None}[self.strategy]
        return {"axis": axis, "group_size": self.group_size, "block_size": self.block}

    def scale_grid(self, shape) -> tuple:
        """The scales' stored shape for a weight of ``shape`` (compressed-tensors keeps the
        ``[out, 1]`` of a channel; one scale is ``[1]``).

        >>> WeightScheme(fp8_code(), "block", True, "float32", FP8_BLOCKS, block=(128, 128)).scale_grid((144, 200))
        (2, 2)
        """
        out, n = shape
        if self.strategy == "tensor":
            return (1,)
        if self.strategy == "channel":
            return (out, 1)
        if self.strategy == "group":
            return (out, -(-n // self.group_size))
        return (-(-out // self.block[0]), -(-n // self.block[1]))

    def api_params(self, p, shape):
        """Scales or zero points in the stored grid as gpuq takes them (None stays None).

        >>> WeightScheme(int_code(8), "channel", True, "bfloat16", PACK).api_params(np.ones((4, 1)), (4, 8)).shape
        (4,)
        """
        if p is None or self.strategy in ("group", "block"):
            return p
        return p.reshape(()) if self.strategy == "tensor" else p.reshape(shape[0])

    def describe(self) -> str:
        """Short wording for a report row.

        >>> WeightScheme(int_code(8), "channel", True, "bfloat16", PACK).describe()
        'int8 sym channel'
        """
        where = {"tensor": "per-tensor", "channel": "channel", "group": f"g={self.group_size}",
                 "block": f"block {'x'.join(map(str, self.block or ()))}"}[self.strategy]
        sym = "" if self.code.zero_point == "none" else ("sym " if self.symmetric else "asym ")
        return f"{self.code.name} {sym}{where}"


def _scale_numpy(name: str) -> np.dtype:
    from ..convert import float_dtype

    return float_dtype(name)


def _scales_float32(arr, name, want_shape) -> np.ndarray:
    """Stored scales as the float32 gpuq takes (bfloat16/float16/float32 widen exactly), in the
    stored grid ``want_shape`` (one scale: any shape of one element)."""
    if arr.dtype.name not in ("bfloat16", "float16", "float32"):
        raise CliError(f"tensor {name!r} is {arr.dtype.name}: scales are bfloat16, float16 or float32")
    if arr.shape != want_shape and not (math.prod(want_shape) == 1 and arr.size == 1):
        raise CliError(f"tensor {name!r} has shape {list(arr.shape)}, expected {list(want_shape)}")
    return arr.astype(np.float32).reshape(want_shape)


class _Layout:
    """One layout: the names and dtypes it stores, how it encodes and decodes."""

    #: compressed-tensors' format name (None for fine-grained fp8, which has no such field)
    name = None

    def companions(self, module: str, scheme: WeightScheme) -> list:
        """The tensors a decoder reads besides the primary one."""
        return [f"{module}.{p}" for p in self.params(scheme)[1:]]

    def primary(self, module: str, scheme: WeightScheme) -> str:
        return f"{module}.{self.params(scheme)[0]}"

    def shape(self, module: str, scheme: WeightScheme, load, specs) -> tuple:
        """The dense weight's shape (known before its codes are read): the stored codes' own."""
        return tuple(specs[self.primary(module, scheme)][0])


class PackQuantized(_Layout):
    """compressed-tensors ``pack-quantized`` (int codes, weight-only)."""

    name = "pack-quantized"

    def params(self, scheme):
        return ("weight_packed", "weight_scale", "weight_shape") + (() if scheme.symmetric else
                                                                     ("weight_zero_point",))

    def entries(self, module, shape, scheme) -> dict:
        """``{name: (shape, dtype)}`` of what a ``[out, in]`` weight becomes."""
        out, n = shape
        bits = scheme.code.bits
        grid = scheme.scale_grid(shape)
        e = {f"{module}.weight_packed": ((out, words_per_row(n, bits)), np.dtype(np.int32)),
             f"{module}.weight_scale": (grid, _scale_numpy(scheme.scale_dtype)),
             f"{module}.weight_shape": ((2,), np.dtype(np.int64))}
        if not scheme.symmetric:
            e[f"{module}.weight_zero_point"] = ((words_per_row(out, bits), grid[1]), np.dtype(np.int32))
        return e

    def encode(self, module, shape, scheme, codes, scales, zps) -> dict:
        """The stored tensors from one-code-per-element int8 ``codes`` and gpuq's parameters."""
        bits = scheme.code.bits
        grid = scheme.scale_grid(shape)
        t = {f"{module}.weight_packed": pack_rows(codes, bits),
             f"{module}.weight_scale": scales.reshape(grid).astype(_scale_numpy(scheme.scale_dtype)),
             f"{module}.weight_shape": np.array(shape, np.int64)}
        if not scheme.symmetric:  # packed down the output dimension: the rows of the transpose
            t[f"{module}.weight_zero_point"] = np.ascontiguousarray(pack_rows(zps.reshape(grid).T, bits).T)
        return t

    def shape(self, module, scheme, load, specs) -> tuple:
        """``weight_shape``, checked: two sizes."""
        name = f"{module}.weight_shape"
        shape = load(name)
        if shape.dtype.kind not in "iu" or shape.shape != (2,) or (shape < 0).any():
            raise CliError(f"tensor {name!r} is not two sizes, got {shape.dtype} {shape.tolist()}")
        return tuple(int(v) for v in shape)

    def decode(self, module, scheme, load) -> tuple:
        """``(codes, scales, zps, shape)`` for gpuq.dequantize from the stored tensors."""
        bits = scheme.code.bits
        shape = self.shape(module, scheme, load, None)
        packed = load(f"{module}.weight_packed")
        want = (shape[0], words_per_row(shape[1], bits))
        if packed.dtype != np.int32 or packed.shape != want:
            raise CliError(f"tensor {module + '.weight_packed'!r} is {packed.dtype} {list(packed.shape)}, "
                           f"expected int32 {list(want)} for weight_shape {list(shape)} at {bits} bits")
        codes = _unpack(unpack_rows, packed, bits, shape[1], module + ".weight_packed")
        grid = scheme.scale_grid(shape)
        scales = _scales_float32(load(f"{module}.weight_scale"), module + ".weight_scale", grid)
        zps = None
        if not scheme.symmetric:
            name = module + ".weight_zero_point"
            zp = load(name)
            want = (words_per_row(shape[0], bits), grid[1])
            if zp.dtype != np.int32 or zp.shape != want:
                raise CliError(f"tensor {name!r} is {zp.dtype} {list(zp.shape)}, expected int32 {list(want)} "
                               f"(zero points packed down the output dimension)")
            zps = _unpack(unpack_rows, np.ascontiguousarray(zp.T), bits, shape[0], name).T.astype(np.int32)
        return codes, scales, zps, shape


def _unpack(fn, words, bits, n, name):
    try:
        return fn(words, bits, n)
    except CliError:  # a ValueError already in its one-line form
        raise
    except ValueError as exc:
        raise CliError(f"tensor {name!r}: {exc}") from None


class NaiveQuantized(_Layout):
    """compressed-tensors ``naive-quantized`` (and ``float-quantized``, ``int-quantized``: the
    same tensors, named for the activations they come with): the codes in their own dtype."""

    name = "naive-quantized"

    def params(self, scheme):
        return ("weight", "weight_scale") + (() if scheme.symmetric else ("weight_zero_point",))

    def entries(self, module, shape, scheme) -> dict:
        e = {f"{module}.weight": (tuple(shape), scheme.code.host_array_dtype()),
             f"{module}.weight_scale": (scheme.scale_grid(shape), _scale_numpy(scheme.scale_dtype))}
        if not scheme.symmetric:
            e[f"{module}.weight_zero_point"] = (scheme.scale_grid(shape), np.dtype(np.int8))
        return e

    def encode(self, module, shape, scheme, codes, scales, zps) -> dict:
        grid = scheme.scale_grid(shape)
        t = {f"{module}.weight": codes,
             f"{module}.weight_scale": scales.reshape(grid).astype(_scale_numpy(scheme.scale_dtype))}
        if not scheme.symmetric:
            t[f"{module}.weight_zero_point"] = zps.reshape(grid).astype(np.int8)
        return t

    def decode(self, module, scheme, load) -> tuple:
        return _decode_plain(module, scheme, load, "weight_scale",
                             None if scheme.symmetric else "weight_zero_point")


class Fp8Blocks(_Layout):
    """Fine-grained fp8 (``quant_method: "fp8"``, ``weight_block_size``): ``weight_scale_inv``."""

    def params(self, scheme):
        return ("weight", "weight_scale_inv")

    def entries(self, module, shape, scheme) -> dict:
        return {f"{module}.weight": (tuple(shape), scheme.code.host_array_dtype()),
                f"{module}.weight_scale_inv": (scheme.scale_grid(shape), np.dtype(np.float32))}

    def encode(self, module, shape, scheme, codes, scales, zps) -> dict:
        return {f"{module}.weight": codes, f"{module}.weight_scale_inv": scales.astype(np.float32)}

    def decode(self, module, scheme, load) -> tuple:
        return _decode_plain(module, scheme, load, "weight_scale_inv", None)


def _decode_plain(module, scheme, load, scale_param, zp_param) -> tuple:
    """Codes stored in their own dtype, scales (and unpacked zero points) beside them."""
    name = f"{module}.weight"
    codes = load(name)
    want = scheme.code.host_array_dtype()
    if codes.dtype != want or codes.ndim != 2:
        raise CliError(f"tensor {name!r} is {codes.dtype} {list(codes.shape)}, expected a 2-D {want} "
                       f"tensor ({scheme.describe()})")
    grid = scheme.scale_grid(codes.shape)
    scales = _scales_float32(load(f"{module}.{scale_param}"), f"{module}.{scale_param}", grid)
    zps = None
    if zp_param is not None:
        zname = f"{module}.{zp_param}"
        zp = load(zname)
        if zp.dtype.kind not in "iu" or zp.size != math.prod(grid):
            raise CliError(f"tensor {zname!r} is {zp.dtype} {list(zp.shape)}, expected integers {list(grid)}")
        zps = zp.astype(np.int32).reshape(grid)
    return codes, scales, zps, codes.shape


PACK, NAIVE, FP8_BLOCKS = PackQuantized(), NaiveQuantized(), Fp8Blocks()
#: compressed-tensors' format names gpuq reads, by the layout each stores.
LAYOUTS = {"pack-quantized": PACK, "naive-quantized": NAIVE, "float-quantized": NAIVE, "int-quantized": NAIVE}


# --- quantization_config ---------------------------------------------------------------------------

def ct_config(scheme: WeightScheme, ignore: list) -> dict:
    """The ``quantization_config`` compressed-tensors 0.20.0 writes for one weight-only scheme
    targeting every Linear but those in ``ignore`` (its keys, in its order of meaning).

    >>> c = ct_config(WeightScheme(int_code(4), "group", False, "bfloat16", PACK, group_size=128), ["lm_head"])
    >>> c["config_groups"]["group_0"]["weights"]
    {'dynamic': False, 'group_size': 128, 'num_bits': 4, 'strategy': 'group', 'symmetric': False, 'type': 'int'}
    """
    weights = {"dynamic": False, "group_size": scheme.group_size, "num_bits": scheme.code.bits,
               "strategy": scheme.strategy, "symmetric": scheme.symmetric, "type": ct_type(scheme.code)}
    group = {"format": scheme.layout.name, "input_activations": None, "output_activations": None,
             "targets": ["Linear"], "weights": weights}
    return {"config_groups": {"group_0": group}, "format": scheme.layout.name,
            "global_compression_ratio": None, "ignore": list(ignore), "kv_cache_scheme": None,
            "moe_sparsity_config": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
            "version": CT_VERSION}


def fp8_blocks_config(ignore: list) -> dict:
    """Fine-grained fp8's ``quantization_config`` (DeepSeek-V3's four keys), with the Linears kept
    in float as ``ignored_layers`` (vLLM's key; transformers takes it as ``modules_to_not_convert``).

    >>> fp8_blocks_config(["lm_head"])["weight_block_size"]
    [128, 128]
    """
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "ignored_layers": list(ignore),
            "quant_method": "fp8", "weight_block_size": list(FP8_BLOCK)}


# --- reading a folder's quantization_config ------------------------------------------------------

#: What the readers accept of compressed-tensors' per-group weight arguments.
_STRATEGIES = ("tensor", "channel", "group", "block")


def read_ct_groups(qc: dict, where: str) -> list:
    """``[(group name, targets, WeightScheme)]`` of a compressed-tensors ``quantization_config``;
    one CliError line (starting with ``where``) for anything gpuq does not read.

    >>> qc = ct_config(WeightScheme(int_code(8), "channel", True, "bfloat16", PACK), ["lm_head"])
    >>> [(g, t, s.describe()) for g, t, s in read_ct_groups(qc, "x")]
    [('group_0', ['Linear'], 'int8 sym channel')]
    """
    def bad(why):
        return CliError(f"{where}: {why}")

    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise bad(f"quantization_status {status!r}: gpuq reads compressed checkpoints")
    for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if qc.get(key):
            raise bad(f"{key} {_short(qc[key])}: gpuq reads weight-only or dynamic-activation "
                      f"quantization, without sparsity, transforms or kv-cache scales")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise bad(f"config_groups is {_short(groups)}, not a non-empty object")
    out = []
    for gname, group in groups.items():
        if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
            raise bad(f"config group {gname!r} has no weights arguments: {_short(group)}")
        targets = group.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise bad(f"config group {gname!r}: targets {_short(targets)} is not a list of names")
        check_patterns(targets, f"config group {gname!r}: targets", bad)
        acts = group.get("input_activations")
        if acts is not None and not (isinstance(acts, dict) and acts.get("dynamic") is True):
            raise bad(f"config group {gname!r}: input_activations {_short(acts)} (static activation "
                      f"scales): gpuq reads weight-only or dynamic-activation quantization")
        if group.get("output_activations") is not None:
            raise bad(f"config group {gname!r}: output_activations {_short(group['output_activations'])}")
        fmt = group.get("format") or qc.get("format")
        layout = LAYOUTS.get(fmt)
        if layout is None:
            raise bad(f"format {fmt!r} (config group {gname!r}): gpuq reads {', '.join(LAYOUTS)}")
        out.append((gname, targets, _weight_scheme(group["weights"], layout, lambda why: bad(
            f"config group {gname!r}: {why}"))))
    return out


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


def _weight_scheme(w: dict, layout, bad) -> WeightScheme:
    kind, bits = w.get("type"), w.get("num_bits")
    code = int_code(bits) if kind == "int" else fp8_code() if kind == "float" and bits == 8 else None
    if code is None or isinstance(bits, bool):
        raise bad(f"weights of type {kind!r} with num_bits {bits!r}: gpuq reads int with 4 or 8 bits "
                  f"and float with 8 (fp8 e4m3)")
    if layout is PACK and kind != "int":
        raise bad("pack-quantized holds int codes, not float ones")
    strategy, symmetric = w.get("strategy"), w.get("symmetric", True)
    if strategy not in _STRATEGIES:
        raise bad(f"weights strategy {strategy!r}: gpuq reads {', '.join(_STRATEGIES)}")
    if w.get("dynamic") not in (False, None) or not isinstance(symmetric, bool):
        raise bad(f"weights dynamic {w.get('dynamic')!r}, symmetric {symmetric!r}: stored weights "
                  f"are static, symmetric true or false")
    if w.get("actorder") not in (None, "static"):
        raise bad(f"weights actorder {w['actorder']!r} (activation order, weight_g_idx) is not supported")
    if kind == "float" and not symmetric:
        raise bad("float weights with symmetric false: fp8 has no zero point")
    group = w.get("group_size") if strategy == "group" else None
    structure = w.get("block_structure")
    block = tuple(structure) if strategy == "block" and isinstance(structure, list) else None
    if strategy == "group" and not (_is_size(group)):
        raise bad(f"group strategy with group_size {group!r}")
    if strategy == "block" and not (block is not None and len(block) == 2 and all(_is_size(b) for b in block)):
        raise bad(f"block strategy with block_structure {_short(structure)}: gpuq reads a list of two "
                  f"block sizes")
    if layout is not PACK and code.storage == "packed":
        raise bad(f"{layout.name} with num_bits {bits}: gpuq reads {bits}-bit int weights as "
                  f"pack-quantized (codes packed into int32 words), not one code per byte")
    return WeightScheme(code, strategy, symmetric, None, layout, group_size=group, block=block)


def read_fp8_blocks(qc: dict, where: str) -> WeightScheme:
    """The scheme of a fine-grained fp8 ``quantization_config``; one CliError line otherwise.

    >>> read_fp8_blocks(fp8_blocks_config([]), "x").describe()
    'float8_e4m3fn block 128x128'
    """
    block = qc.get("weight_block_size")
    if block is None:
        raise CliError(f"{where}: quant_method 'fp8' without weight_block_size (per-tensor fp8, "
                       f"weight_scale): gpuq reads fine-grained fp8 (weight_block_size, weight_scale_inv)")
    if not (isinstance(block, list) and len(block) == 2 and all(_is_size(b) for b in block)):
        raise CliError(f"{where}: weight_block_size {_short(block)} is not two positive sizes")
    if qc.get("fmt", "e4m3") != "e4m3" or qc.get("activation_scheme", "dynamic") != "dynamic":
        raise CliError(f"{where}: fmt {qc.get('fmt')!r}, activation_scheme {qc.get('activation_scheme')!r}: "
                       f"gpuq reads fine-grained fp8 with fmt 'e4m3' and dynamic activations")
    return WeightScheme(fp8_code(), "block", True, None, FP8_BLOCKS, block=tuple(block))


def _is_size(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _short(obj) -> str:
    import json

    text = json.dumps(obj, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
