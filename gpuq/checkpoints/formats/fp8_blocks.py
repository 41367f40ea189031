"""Fine-grained fp8 model folders: float8_e4m3fn weights with one ``weight_scale_inv`` per
128x128 block (DeepSeek-V3, Qwen3-FP8; ``quant_method: "fp8"`` with ``weight_block_size``).

>>> name, reads("/nonexistent")
('fp8-blocks', False)
"""

from __future__ import annotations

from ..._codetypes import as_code_type
from ..files import CliError
from ..selection import parse_block
from ..serving.formats import FP8_BLOCK, FP8_BLOCKS, fp8_code
from ..serving.quantize import Request
from . import _folder, _serving
from .describe import describe_folder

name = "fp8-blocks"
#: config.json's quant_method of this format.
QUANT_METHOD = "fp8"


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
    return Request(name, code, "block", None, True, FP8_BLOCKS)


check, quantize, dequantize = _serving.steps(request)


def reads(src) -> bool:
    return _folder.quant_method(src) == QUANT_METHOD


def describe(src) -> dict:
    return describe_folder(src, name)
