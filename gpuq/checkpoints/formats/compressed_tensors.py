"""compressed-tensors model folders (pack-quantized int4/int8, naive-, int- and float-quantized):
what vLLM, SGLang and transformers load (``docs/serving-formats.md``).

>>> name, reads("/nonexistent")
('compressed-tensors', False)
"""

from __future__ import annotations

from ..._codetypes import as_code_type
from ..files import CliError
from ..serving.formats import FP8_BLOCK, NAIVE, PACK, fp8_code, int_code
from ..serving.quantize import Request
from . import _folder, _serving
from .describe import describe_folder

name = "compressed-tensors"
#: config.json's quant_method of this format.
QUANT_METHOD = "compressed-tensors"


def request(opts) -> Request:
    """The scheme ``opts`` ask for, refused (one line naming the flag) where compressed-tensors
    or vLLM's kernels cannot hold it.

    >>> import types
    >>> o = types.SimpleNamespace(dtype="int4", axis=None, per_tensor=False, group_size=None,
    ...                           symmetric=False, asymmetric=False, block=None)
    >>> r = request(o); r.strategy, r.group_size, r.symmetric
    ('group', 128, True)
    """
    if opts.block is not None:
        raise CliError(f"--block {opts.block}: --format fp8-blocks has {FP8_BLOCK[0]}x{FP8_BLOCK[1]} blocks "
                       f"(its weight_block_size), and compressed-tensors is written per channel, "
                       f"group or tensor")
    axis, group_size = opts.axis, opts.group_size
    code = as_code_type(opts.dtype or "int8", "--dtype")
    takes = (int_code(8), int_code(4), fp8_code())
    if code not in takes:
        raise CliError(f"--format compressed-tensors takes --dtype {', '.join(c.name for c in takes)}, got "
                       f"{code.name} (compressed-tensors' int codes are signed: --asymmetric int8/int4 "
                       f"holds what uint8/uint4 would)")
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
    return Request(name, code, strategy, group_size, fp8 or not opts.asymmetric, NAIVE if fp8 else PACK)


check, quantize, dequantize = _serving.steps(request)


def reads(src) -> bool:
    return _folder.quant_method(src) == QUANT_METHOD


def describe(src) -> dict:
    return describe_folder(src, name)
