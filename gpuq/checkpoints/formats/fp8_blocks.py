"""Fine-grained fp8 model folders: float8_e4m3fn weights with one ``weight_scale_inv`` per
128x128 block (DeepSeek-V3, Qwen3-FP8; ``quant_method: "fp8"`` with ``weight_block_size``).

A quantized Linear ``M`` is stored as ``M.weight`` F8_E4M3 and ``M.weight_scale_inv`` float32
``[ceil(out / 128), ceil(in / 128)]``: the scale of each 128 x 128 block (ragged at the edges),
multiplied on dequantize (``docs/serving-formats.md``). The module is a
:class:`~gpuq.checkpoints.formats._serving.ServingFormat`.

>>> name, reads("/nonexistent")
('fp8-blocks', False)
"""

from __future__ import annotations

import sys

import numpy as np

from ..._codetypes import as_code_type
from ..files import CliError
from ..selection import parse_block
from ..serving.dequantize import float8_weights
from ..serving.formats import Layout, WeightScheme, decode_plain, fp8_code, is_size, short
from ..serving.quantize import Request
from ..serving.selection import module_of
from . import _folder, _serving
from .describe import describe_folder

name = "fp8-blocks"
#: config.json's quant_method of this format.
QUANT_METHOD = "fp8"
#: The quantization_config key of the Linears kept in float (vLLM's; transformers' is
#: ``modules_to_not_convert``, which is read too).
IGNORE_KEY = "ignored_layers"
#: The one block shape of fine-grained fp8 that gpuq writes (DeepSeek-V3's, Qwen3-FP8's).
FP8_BLOCK = (128, 128)


class Fp8Blocks(Layout):
    """Fine-grained fp8 (``quant_method: "fp8"``, ``weight_block_size``): ``weight_scale_inv``."""

    one_pass = "blocks"  # gpuq.checkpoints.fused: the codes' bytes and the block grid in one pass

    def params(self, scheme):
        return ("weight", "weight_scale_inv")

    def entries(self, module, shape, scheme) -> dict:
        return {f"{module}.weight": (tuple(shape), scheme.code.host_array_dtype()),
                f"{module}.weight_scale_inv": (scheme.scale_grid(shape), np.dtype(np.float32))}

    def encode(self, module, shape, scheme, codes, scales, zps) -> dict:
        return {f"{module}.weight": codes, f"{module}.weight_scale_inv": scales.astype(np.float32)}

    def decode(self, module, scheme, load) -> tuple:
        return decode_plain(module, scheme, load, "weight_scale_inv", None)


FP8_BLOCKS = Fp8Blocks()


def request(opts) -> Request:
    """The one scheme of the format (float8_e4m3fn, 128x128 blocks); other options refused.

    >>> import types
    >>> o = types.SimpleNamespace(dtype=None, axis=None, per_tensor=False, group_size=None,
    ...                           symmetric=False, asymmetric=False, block="128x128")
    >>> request(o).scheme("float32").describe()
    'float8_e4m3fn block 128x128'
    """
    if opts.block is not None and parse_block(opts.block, "--block") != FP8_BLOCK:
        raise CliError(f"--block {opts.block}: --format fp8-blocks has {FP8_BLOCK[0]}x{FP8_BLOCK[1]} blocks "
                       f"(its weight_block_size), and compressed-tensors is written per channel, "
                       f"group or tensor")
    code = as_code_type(opts.dtype or fp8_code().name, "--dtype")
    if (code != fp8_code() or opts.axis is not None or opts.per_tensor or opts.group_size is not None
            or opts.asymmetric):
        raise CliError(f"--format fp8-blocks has one scheme, {fp8_code().name} with one scale per "
                       f"{FP8_BLOCK[0]}x{FP8_BLOCK[1]} block: drop --dtype other than {fp8_code().name}, "
                       f"--axis, --per-tensor, --group-size and --asymmetric")
    return Request(name, code, "block", None, True, FP8_BLOCKS, FP8_BLOCK)


check, quantize, dequantize = _serving.steps(sys.modules[__name__])


def scale_dtype(model) -> str:
    """Fine-grained fp8's scales are float32 whatever the model's dtype."""
    return "float32"


def quantization_config(ignore: list) -> dict:
    """Fine-grained fp8's ``quantization_config`` (DeepSeek-V3's four keys), with the Linears kept
    in float as ``ignored_layers`` (vLLM's key; transformers takes it as ``modules_to_not_convert``).

    >>> quantization_config(["lm_head"])["weight_block_size"]
    [128, 128]
    """
    return {"activation_scheme": "dynamic", "fmt": "e4m3", IGNORE_KEY: list(ignore),
            "quant_method": QUANT_METHOD, "weight_block_size": list(FP8_BLOCK)}


def config(model_config: dict, scheme, ignore: list) -> dict:
    """config.json with :func:`quantization_config` (its dtype stays the model's)."""
    return {**model_config, "quantization_config": quantization_config(ignore)}


def read_scheme(qc: dict, where: str) -> WeightScheme:
    """The scheme of a fine-grained fp8 ``quantization_config``; one CliError line otherwise.

    >>> read_scheme(quantization_config([]), "x").describe()
    'float8_e4m3fn block 128x128'
    """
    block = qc.get("weight_block_size")
    if block is None:
        raise CliError(f"{where}: quant_method 'fp8' without weight_block_size (per-tensor fp8, "
                       f"weight_scale): gpuq reads fine-grained fp8 (weight_block_size, weight_scale_inv)")
    if not (isinstance(block, list) and len(block) == 2 and all(is_size(b) for b in block)):
        raise CliError(f"{where}: weight_block_size {short(block)} is not two positive sizes")
    if qc.get("fmt", "e4m3") != "e4m3" or qc.get("activation_scheme", "dynamic") != "dynamic":
        raise CliError(f"{where}: fmt {qc.get('fmt')!r}, activation_scheme {qc.get('activation_scheme')!r}: "
                       f"gpuq reads fine-grained fp8 with fmt 'e4m3' and dynamic activations")
    return WeightScheme(fp8_code(), "block", True, None, FP8_BLOCKS, block=tuple(block))


def read_folder(qc: dict, specs: dict, where: str) -> tuple:
    """``({module: scheme}, what)``: every module with a ``weight_scale_inv`` or a float8 weight
    that ``ignored_layers`` (``modules_to_not_convert``) does not name."""
    scheme = read_scheme(qc, where)
    ignored = qc.get(IGNORE_KEY) or qc.get("modules_to_not_convert") or []
    if not isinstance(ignored, list) or not all(isinstance(i, str) for i in ignored):
        raise CliError(f"{where}: ignored_layers {ignored!r} is not a list of module names")
    found = {n.rpartition(".")[0] for n in specs if n.endswith(".weight_scale_inv")}
    found |= {m for m in float8_weights(specs) if m not in ignored}
    return {m: scheme for m in found}, "fine-grained fp8"


def column_notes(request) -> list:
    """None: fine-grained fp8's vLLM column is the merged layers' block rule, said in its rows."""
    return []


def load_notes(chosen: dict, specs: dict, request) -> list:
    """The line saying a folder will not load right in transformers 5.24 (docs/serving-formats.md),
    what it does instead and what loads it right; none where it loads.

    Ragged edge blocks (a dimension over 128 and no multiple of it): dequantizing on load, as it
    does without a GPU, transformers takes the block as ``rows // scale_rows`` x ``cols // scale_cols``.

    >>> r = Request(name, fp8_code(), "block", None, True, FP8_BLOCKS, FP8_BLOCK)
    >>> note = load_notes({"a.weight": r.scheme("float32")}, {"a.weight": ((144, 100), np.dtype("float32"))}, r)[0]
    >>> note.split(": it ")[1]
    'loads 1 with wrong weights; vLLM and gpuq dequantize read it right'
    """
    ragged, refused = [], 0
    for weight, scheme in chosen.items():
        shape = specs[weight][0]
        grid = scheme.scale_grid(shape)
        if any(d > b and d % b for d, b in zip(shape, scheme.block)):
            ragged.append(f"{module_of(weight)} {shape[0]}x{shape[1]}")
            refused += any(d % g for d, g in zip(shape, grid))
    if not ragged:
        return []
    what = [f"loads {len(ragged) - refused} with wrong weights"] if len(ragged) > refused else []
    what += [f"refuses {refused} (not divisible by scale grid: the load stops)"] if refused else []
    return [f"note: transformers 5.24 does not load this folder right: {len(ragged)} weight"
            f"{'s have' if len(ragged) > 1 else ' has'} ragged edge blocks (a dimension over 128 that is "
            f"no multiple of it: {ragged[0]}{', ...' if len(ragged) > 1 else ''}), whose block it takes as "
            f"rows // scale rows x cols // scale cols when it dequantizes on load (as it does without a "
            f"GPU): it {' and '.join(what)}; vLLM and gpuq dequantize read it right"]


def reads(src) -> bool:
    return _folder.quant_method(src) == QUANT_METHOD


def describe(src) -> dict:
    return describe_folder(src, name, {QUANT_METHOD: read_folder})
