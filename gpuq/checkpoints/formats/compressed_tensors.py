"""compressed-tensors model folders (pack-quantized int4/int8, naive-, int- and float-quantized):
what vLLM, SGLang and transformers load (``docs/serving-formats.md``). The module is a
:class:`~gpuq.checkpoints.formats._serving.ServingFormat`.

For a quantized Linear ``M`` (``docs/serving-formats.md`` has the source line of each fact):

====================  ==========================================================================
layout                tensors
====================  ==========================================================================
pack-quantized        ``M.weight_packed`` int32 ``[out, ceil(in * bits / 32)]``
(int codes)           (:mod:`gpuq.checkpoints.serving.packing`), ``M.weight_scale`` ``[out, 1]``
                      (channel) or ``[out, in / G]`` (group) in the scale dtype, ``M.weight_shape``
                      int64 ``[out, in]``, and when asymmetric ``M.weight_zero_point`` int32
                      packed down the output dimension ``[ceil(out * bits / 32), 1 or in / G]``
naive-quantized,      ``M.weight`` in the code dtype (F8_E4M3 for fp8, I8 for int8), ``M.weight_scale``
float-quantized,      ``[1]`` (tensor), ``[out, 1]``, ``[out, in / G]`` or ``[ceil(out / b0), ceil(in / b1)]``
int-quantized         (block), and when asymmetric an unpacked ``M.weight_zero_point`` of that shape
====================  ==========================================================================

>>> name, reads("/nonexistent")
('compressed-tensors', False)
"""

from __future__ import annotations

import re
import sys

import numpy as np

from ..._codetypes import as_code_type
from ..files import CliError
from ..report import natural_key
from ..serving.dequantize import float8_weights
from ..serving.formats import (Layout, WeightScheme, check_patterns, decode_plain, fp8_code, int_code, is_size,
                               scale_numpy, scales_float32, short)
from ..serving.packing import pack_rows, unpack_rows, words_per_row
from ..serving.quantize import Request, model_dtype
from . import _folder, _serving, ct_microscaling, ct_presets
from .describe import describe_folder
from .fp8_blocks import FP8_BLOCK

name = "compressed-tensors"
#: config.json's quant_method of this format.
QUANT_METHOD = "compressed-tensors"
#: The quantization_config key of the Linears kept in float.
IGNORE_KEY = "ignore"
#: The compressed-tensors version whose format gpuq writes and reads (its config's "version").
CT_VERSION = "0.20.0"


class PackQuantized(Layout):
    """compressed-tensors ``pack-quantized`` (int codes, weight-only)."""

    name = "pack-quantized"
    #: What the one-pass weight loop (gpuq.checkpoints.fused) writes for this layout: int32 words.
    one_pass = "words"

    def params(self, scheme):
        return ("weight_packed", "weight_scale", "weight_shape") + (() if scheme.symmetric else
                                                                     ("weight_zero_point",))

    def entries(self, module, shape, scheme) -> dict:
        """``{name: (shape, dtype)}`` of what a ``[out, in]`` weight becomes."""
        out, n = shape
        bits = scheme.code.bits
        grid = scheme.scale_grid(shape)
        e = {f"{module}.weight_packed": ((out, words_per_row(n, bits)), np.dtype(np.int32)),
             f"{module}.weight_scale": (grid, scale_numpy(scheme.scale_dtype)),
             f"{module}.weight_shape": ((2,), np.dtype(np.int64))}
        if not scheme.symmetric:
            e[f"{module}.weight_zero_point"] = ((words_per_row(out, bits), grid[1]), np.dtype(np.int32))
        return e

    def encode(self, module, shape, scheme, codes, scales, zps) -> dict:
        """The stored tensors from one-code-per-element int8 ``codes`` and gpuq's parameters."""
        return self.encode_words(module, shape, scheme, pack_rows(codes, scheme.code.bits), scales, zps)

    def encode_words(self, module, shape, scheme, words, scales, zps) -> dict:
        """The stored tensors from the codes already packed into int32 ``words`` (the one-pass
        path, :mod:`gpuq.checkpoints.fused`) and gpuq's parameters."""
        bits = scheme.code.bits
        grid = scheme.scale_grid(shape)
        t = {f"{module}.weight_packed": words,
             f"{module}.weight_scale": scales.reshape(grid).astype(scale_numpy(scheme.scale_dtype)),
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
        scales = scales_float32(load(f"{module}.weight_scale"), module + ".weight_scale", grid)
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


class NaiveQuantized(Layout):
    """compressed-tensors ``naive-quantized`` (and ``float-quantized``, ``int-quantized``: the
    same tensors, named for the activations they come with): the codes in their own dtype."""

    name = "naive-quantized"
    #: The one-pass weight loop writes the codes' own bytes (fp8) for this layout.
    one_pass = "bytes"

    def params(self, scheme):
        return ("weight", "weight_scale") + (() if scheme.symmetric else ("weight_zero_point",))

    def entries(self, module, shape, scheme) -> dict:
        e = {f"{module}.weight": (tuple(shape), scheme.code.host_array_dtype()),
             f"{module}.weight_scale": (scheme.scale_grid(shape), scale_numpy(scheme.scale_dtype))}
        if not scheme.symmetric:
            e[f"{module}.weight_zero_point"] = (scheme.scale_grid(shape), np.dtype(np.int8))
        return e

    def encode(self, module, shape, scheme, codes, scales, zps) -> dict:
        grid = scheme.scale_grid(shape)
        t = {f"{module}.weight": codes,
             f"{module}.weight_scale": scales.reshape(grid).astype(scale_numpy(scheme.scale_dtype))}
        if not scheme.symmetric:
            t[f"{module}.weight_zero_point"] = zps.reshape(grid).astype(np.int8)
        return t

    def decode(self, module, scheme, load) -> tuple:
        return decode_plain(module, scheme, load, "weight_scale",
                             None if scheme.symmetric else "weight_zero_point")


class _Named(NaiveQuantized):
    """``int-quantized`` / ``float-quantized``: naive-quantized's tensors under the name
    compressed-tensors infers for weights with dynamic activations (the W8A8 and fp8 presets)."""

    def __init__(self, name):
        self.name = name

    def refuses(self, shape, scheme):
        if scheme.strategy == "block" and (shape[0] % scheme.block[0] or shape[1] % scheme.block[1]):
            return (f"its shape {list(shape)} is not a whole number of {scheme.block[0]}x{scheme.block[1]} "
                    f"blocks (the FP8_BLOCK preset quantizes those only)")
        return super().refuses(shape, scheme)


PACK, NAIVE = PackQuantized(), NaiveQuantized()
INT_Q, FLOAT_Q = _Named("int-quantized"), _Named("float-quantized")
#: compressed-tensors' format names gpuq reads, by the layout each stores.
LAYOUTS = {"pack-quantized": PACK, "naive-quantized": NAIVE, "float-quantized": FLOAT_Q, "int-quantized": INT_Q,
           **ct_microscaling.LAYOUTS}
#: The layouts that store codes one per element in ``M.weight`` beside ``M.weight_scale``.
_PLAIN = (NAIVE, INT_Q, FLOAT_Q)




def request(opts) -> Request:
    """The scheme ``opts`` ask for (``opts.preset``: :mod:`.ct_presets`), refused (one line
    naming the flag) where compressed-tensors or vLLM's kernels cannot hold it.

    fp4/fp6 codes (``--dtype float4_e2m1fn`` / ``float6_e2m3fn``) and MX fp8 take ``--scales
    mx`` (e8m0 per 32, ``--scale-rule``) or, for fp4, ``--scales nvfp4`` (e4m3 per 16 and a global
    scale); ``opts.scales`` / ``opts.scale_rule`` are read where the options have them.

    >>> import types
    >>> o = types.SimpleNamespace(dtype="int4", axis=None, per_tensor=False, group_size=None,
    ...                           symmetric=False, asymmetric=False, block=None)
    >>> r = request(o); r.strategy, r.group_size, r.symmetric
    ('group', 128, True)
    >>> request(types.SimpleNamespace(preset="NVFP4A16", calibrate="minmax")).layout.name
    'nvfp4-pack-quantized'
    """
    preset = getattr(opts, "preset", None)
    rule = getattr(opts, "scale_rule", None)
    if preset is not None:
        dtype, strategy, group, symmetric, block, scales, _ = ct_presets.PRESETS[ct_presets.check_preset(preset)]
        code = as_code_type(dtype)
        if scales is not None:
            return _micro_request(code, scales, rule, getattr(opts, "calibrate", "minmax"), preset, preset)
        layout = PACK if code.storage == "packed" or code.codec == "affine" and strategy == "group" else \
            INT_Q if code.codec == "affine" else FLOAT_Q
        return Request(name, code, strategy, group, symmetric, layout, block, scale_rule=rule, preset=preset)
    if opts.block is not None:
        raise CliError(f"--block {opts.block}: --format fp8-blocks has {FP8_BLOCK[0]}x{FP8_BLOCK[1]} blocks "
                       f"(its weight_block_size), and compressed-tensors is written per channel, "
                       f"group or tensor")
    axis, group_size = opts.axis, opts.group_size
    code = as_code_type(opts.dtype or "int8", "--dtype")
    scales = getattr(opts, "scales", None)
    if scales in ("mx", "nvfp4"):
        if opts.asymmetric or axis not in (None, 1, -1) or opts.per_tensor:
            raise CliError(f"--scales {scales}: compressed-tensors' {scales.upper()} weights are symmetric, in "
                           f"groups along the input dimension: drop --asymmetric, --axis, --per-tensor")
        want = 16 if scales == "nvfp4" else 32
        if group_size not in (None, want):
            raise CliError(f"--group-size {group_size}: compressed-tensors' {scales.upper()} groups are {want}")
        return _micro_request(code, scales, rule, getattr(opts, "calibrate", "minmax"), None, f"--scales {scales}")
    takes = (int_code(8), int_code(4), fp8_code())
    if code not in takes:
        raise CliError(f"--format compressed-tensors takes --dtype {', '.join(c.name for c in takes)}, got "
                       f"{code.name} (compressed-tensors' int codes are signed: --asymmetric int8/int4 "
                       f"holds what uint8/uint4 would; fp4/fp6 with --scales mx or nvfp4)")
    fp8 = code.codec == "float8"
    if fp8 and (opts.asymmetric or group_size is not None):
        raise CliError(f"{code.name} has no zero point and compressed-tensors stores it per channel "
                       f"or per tensor: drop --asymmetric and --group-size")
    if opts.symmetric and opts.asymmetric:
        raise CliError("--symmetric and --asymmetric: choose one")
    if axis is not None and axis != 0 and group_size is None:
        raise CliError(f"--axis {axis}: compressed-tensors scales output channels (--axis 0), groups "
                       f"along the input (--group-size G) or the whole tensor (--per-tensor, fp8)")
    if group_size is not None and group_size < 1:
        raise CliError(f"--group-size must be a positive integer, got {group_size}")
    if group_size is not None and axis not in (None, 1, -1):
        raise CliError(f"--group-size groups along the input dimension (axis 1), got --axis {axis}")
    if opts.per_tensor and not fp8:
        raise CliError(f"--per-tensor: vLLM's kernels for {code.name} weights (wNa16) take channel or "
                       f"group scales")
    if group_size is None and code.storage == "packed" and axis is None:
        group_size = 128
    strategy = "tensor" if opts.per_tensor else "group" if group_size is not None else "channel"
    return Request(name, code, strategy, group_size, fp8 or not opts.asymmetric, NAIVE if fp8 else PACK,
                   scale_rule=rule)


#: The code types of each microscaling kind compressed-tensors 0.20 stores.
_MICRO_CODES = {"nvfp4": ("float4_e2m1fn",), "mx": ("float4_e2m1fn", "float6_e2m3fn", "float8_e4m3fn")}


def _micro_request(code, scales, rule, calibrate, preset, what) -> Request:
    """NVFP4 or MX weights of ``code``: refused where compressed-tensors has no such format."""
    from ..._mx import RULES

    if code.name not in _MICRO_CODES[scales]:
        raise CliError(f"{what}: compressed-tensors stores {' and '.join(_MICRO_CODES[scales])} codes with "
                       f"{scales.upper()} scales, got --dtype {code.name}")
    if scales == "nvfp4" and rule is not None:
        raise CliError(f"--scale-rule {rule}: NVFP4's e4m3 block scales have one rule (compressed-tensors')")
    if scales == "mx" and rule is not None and rule not in RULES:
        raise CliError(f"--scale-rule {rule}: MX scales take {', '.join(RULES)}")
    if calibrate != "minmax":
        raise CliError(f"--calibrate {calibrate}: {what} scales come from each block's max |x| (minmax)")
    scheme = ct_microscaling.scheme_for(code, scales, scale_rule=rule)
    return Request(name, code, scheme.strategy, scheme.group_size, True, scheme.layout,
                   scale_dtype=scheme.scale_dtype, scale_rule=rule, preset=preset)


check, quantize, dequantize = _serving.steps(sys.modules[__name__])


def scale_dtype(model) -> str:
    """The model's dtype: vLLM allocates compressed-tensors' scales in it."""
    return model_dtype(model)


def ct_type(code) -> str:
    """compressed-tensors' ``"type"`` of a code row.

    >>> ct_type(int_code(4)), ct_type(fp8_code())
    ('int', 'float')
    """
    return "float" if code.codec == "float8" else "int"


def quantization_config(scheme: WeightScheme, ignore: list) -> dict:
    """The ``quantization_config`` compressed-tensors 0.20.0 writes for one scheme targeting every
    Linear but those in ``ignore`` (its keys, in its order of meaning): the weights' arguments
    and, for a preset with dynamic activations, its ``input_activations``.

    >>> s = WeightScheme(int_code(4), "group", False, "bfloat16", PACK, group_size=128)
    >>> c = quantization_config(s, ["lm_head"])
    >>> c["config_groups"]["group_0"]["weights"]
    {'dynamic': False, 'group_size': 128, 'num_bits': 4, 'strategy': 'group', 'symmetric': False, 'type': 'int'}
    """
    weights = {"dynamic": False, "group_size": scheme.group_size, "num_bits": scheme.code.bits,
               "strategy": scheme.strategy, "symmetric": scheme.symmetric, "type": ct_type(scheme.code)}
    if scheme.strategy == "block":
        weights["block_structure"] = list(scheme.block)
    if scheme.scale_dtype in ct_microscaling.CT_SCALE_DTYPES:
        weights["scale_dtype"] = ct_microscaling.CT_SCALE_DTYPES[scheme.scale_dtype]
    acts = ct_presets.PRESETS[scheme.preset][6] if scheme.preset is not None else None
    group = {"format": scheme.layout.name, "input_activations": acts, "output_activations": None,
             "targets": ["Linear"], "weights": weights}
    return {"config_groups": {"group_0": group}, "format": scheme.layout.name,
            "global_compression_ratio": None, "ignore": list(ignore), "kv_cache_scheme": None,
            "moe_sparsity_config": None, "quant_method": QUANT_METHOD,
            "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
            "version": CT_VERSION}


def config(model_config: dict, scheme, ignore: list) -> dict:
    """config.json with :func:`quantization_config`, and the scales' dtype as ``dtype`` where it
    names none (the dtype inferred from the weights: readers need it)."""
    out = {**model_config, "quantization_config": quantization_config(scheme, ignore)}
    if not any(k in out for k in ("dtype", "torch_dtype")):
        out["dtype"] = scheme.scale_dtype
    return out


def column_notes(request) -> list:
    """What the vLLM column checks for int codes and fp4 weight-only codes (fp8's and fp6's
    column is all '-')."""
    if request.code.codec == "float8" and request.code.bits == 4 and request.preset != "MXFP4":
        return ["note: vLLM column: fp4 Marlin's shape rules (out padded to 64; in % 128, or in % 64 with "
                "the padded out % 128; groups of 16 with e4m3 scales, 32 with e8m0); '-' where no rule "
                "is checked"]
    if request.code.codec == "float8":
        return []
    return ["note: vLLM column: Marlin's shape rules for int weights (group -1/32/64/128, "
            "out % 64, in % 128); '-' where no rule is checked"]


def load_notes(chosen: dict, specs: dict, request) -> list:
    """The line saying an asymmetric folder will not load in transformers 5.24: it allocates an
    unpacked ``weight_zero_point`` and refuses the packed one (llm-compressor#1618); the one
    saying a float16 MXFP4 folder will not load in vLLM; the one saying transformers 5.24 will not
    load per-expert NVFP4 or MXFP8 MoE weights right (:func:`_expert_note`)."""
    notes = _expert_note(chosen, request)
    if request.layout is ct_microscaling.MX[4] and any(specs[n][1].name == "float16" for n in chosen):
        notes.append("note: vLLM's MXFP4 kernel (Marlin) takes bfloat16 activations only: this float16 "
                     "model's MXFP4 layers do not load there (convert the model to bfloat16 first)")
    if request.symmetric:
        return notes
    return notes + ["note: transformers 5.24 does not load this folder: --asymmetric compressed-tensors' packed "
            "weight_zero_point is refused with a size mismatch (llm-compressor#1618); vLLM (the layers "
            "its column rates ok) and gpuq dequantize read it right"]


def _expert_note(chosen: dict, request) -> list:
    """transformers 5.24 fuses per-expert Linears (``...experts.N.gate_proj``, Mixtral's ``w1``)
    into 3-D parameters and dequantizes them on load in ``CompressedTensorsDequantize.convert``
    (``transformers/integrations/compressed_tensors.py``): NVFP4 experts lose their global scale
    there (each weight comes out multiplied by it), MXFP8 experts stop the load (the scale bytes
    multiply the codes without their groups expanded). MXFP4 and MXFP6 experts load right.

    >>> r = type("Request", (), {"layout": ct_microscaling.NVFP4})()
    >>> _expert_note({"model.layers.0.mlp.experts.3.up_proj.weight": None}, r)[0][:68]
    'note: transformers 5.24 does not load this folder right: its 1 per-e'
    >>> _expert_note({"model.layers.0.mlp.up_proj.weight": None}, r)
    []
    """
    experts = [n for n in chosen if _PER_EXPERT.search(n)]
    if not experts or request.layout not in (ct_microscaling.NVFP4, ct_microscaling.MX[8]):
        return []
    what = ("come out multiplied by their global scale" if request.layout is ct_microscaling.NVFP4
            else "stop the load with a conversion error")
    return [f"note: transformers 5.24 does not load this folder right: its {len(experts)} per-expert "
            f"{request.layout.name} weights (e.g. {experts[0]}) {what} in its fused-experts dequantizer "
            "(transformers' CompressedTensorsDequantize.convert); vLLM and gpuq dequantize read them right"]


#: A per-expert Linear's tensor name: ``...experts.<index>.<projection>...``.
_PER_EXPERT = re.compile(r"(^|\.)experts\.\d+\.")


#: What the readers accept of compressed-tensors' per-group weight arguments.
_STRATEGIES = ("tensor", "channel", "group", "block")


def read_groups(qc: dict, where: str) -> list:
    """``[(group name, targets, WeightScheme)]`` of a compressed-tensors ``quantization_config``;
    one CliError line (starting with ``where``) for anything gpuq does not read.

    >>> qc = quantization_config(WeightScheme(int_code(8), "channel", True, "bfloat16", PACK), ["lm_head"])
    >>> [(g, t, s.describe()) for g, t, s in read_groups(qc, "x")]
    [('group_0', ['Linear'], 'int8 sym channel')]
    """
    def bad(why):
        return CliError(f"{where}: {why}")

    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise bad(f"quantization_status {status!r}: gpuq reads compressed checkpoints")
    for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if qc.get(key):
            raise bad(f"{key} {short(qc[key])}: gpuq reads weight-only or dynamic-activation "
                      f"quantization, without sparsity, transforms or kv-cache scales")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise bad(f"config_groups is {short(groups)}, not a non-empty object")
    out = []
    for gname, group in groups.items():
        if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
            raise bad(f"config group {gname!r} has no weights arguments: {short(group)}")
        targets = group.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise bad(f"config group {gname!r}: targets {short(targets)} is not a list of names")
        check_patterns(targets, f"config group {gname!r}: targets", bad)
        acts = group.get("input_activations")
        if acts is not None and not (isinstance(acts, dict) and acts.get("dynamic") is True):
            raise bad(f"config group {gname!r}: input_activations {short(acts)} (static activation "
                      f"scales): gpuq reads weight-only or dynamic-activation quantization")
        if group.get("output_activations") is not None:
            raise bad(f"config group {gname!r}: output_activations {short(group['output_activations'])}")
        fmt = group.get("format") or qc.get("format")
        layout = LAYOUTS.get(fmt)
        if layout is None:
            raise bad(f"format {fmt!r} (config group {gname!r}): gpuq reads {', '.join(LAYOUTS)}")
        out.append((gname, targets, _weight_scheme(group["weights"], layout, lambda why: bad(
            f"config group {gname!r}: {why}"))))
    return out


def _weight_scheme(w: dict, layout, bad) -> WeightScheme:
    if layout in ct_microscaling.LAYOUTS.values():
        return ct_microscaling.read_scheme(w, layout, bad)
    kind, bits = w.get("type"), w.get("num_bits")
    code = int_code(bits) if kind == "int" else fp8_code() if kind == "float" and bits == 8 else None
    if code is None or isinstance(bits, bool):
        raise bad(f"weights of type {kind!r} with num_bits {bits!r}: gpuq reads int with 4 or 8 bits "
                  f"and float with 8 (fp8 e4m3); fp4/fp6 in the nvfp4/mxfp4/mxfp6 formats")
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
    if strategy == "group" and not (is_size(group)):
        raise bad(f"group strategy with group_size {group!r}")
    if strategy == "block" and not (block is not None and len(block) == 2 and all(is_size(b) for b in block)):
        raise bad(f"block strategy with block_structure {short(structure)}: gpuq reads a list of two "
                  f"block sizes")
    if layout is not PACK and code.storage == "packed":
        raise bad(f"{layout.name} with num_bits {bits}: gpuq reads {bits}-bit int weights as "
                  f"pack-quantized (codes packed into int32 words), not one code per byte")
    return WeightScheme(code, strategy, symmetric, None, layout, group_size=group, block=block)



def read_folder(qc: dict, specs: dict, where: str) -> tuple:
    """``({module: scheme}, what)``: the modules with compressed-tensors' tensors, each with the
    scheme of the config group that targets it."""
    groups = read_groups(qc, where)
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise CliError(f"{where}: ignore {ignore!r} is not a list of module names")
    check_patterns(ignore, f"{where}: ignore", CliError)
    found = {n.rpartition(".")[0] for n in specs if n.endswith((".weight_packed", ".weight_scale"))}
    found |= {m for m in float8_weights(specs) if not any(_match(m, i) for i in ignore)}
    modules = {m: _ct_scheme(m, groups, ignore, where) for m in sorted(found, key=natural_key)}
    return modules, "compressed-tensors " + "/".join(sorted({s.layout.name for s in modules.values()}))


def _ct_scheme(module, groups, ignore, where):
    if any(_match(module, i) for i in ignore):
        raise CliError(f"{where}: module {module!r} holds quantized tensors but the config's ignore "
                       f"list names it")
    schemes = {s for _, targets, s in groups if "Linear" in targets or any(_match(module, t) for t in targets)}
    if len(schemes) != 1:
        which = "no config group's targets match it" if not schemes else "config groups disagree on it"
        raise CliError(f"{where}: module {module!r} holds quantized tensors but {which}")
    return schemes.pop()


def _match(name: str, target: str) -> bool:
    """compressed-tensors' ``match_name``: ``re:`` + a regular expression (matched at the start),
    else the exact name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name




def reads(src) -> bool:
    return _folder.quant_method(src) == QUANT_METHOD


def describe(src) -> dict:
    return describe_folder(src, name, {QUANT_METHOD: read_folder})
