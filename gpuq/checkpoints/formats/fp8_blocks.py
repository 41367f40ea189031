"""Fine-grained fp8 model folders: float8_e4m3fn weights with one ``weight_scale_inv`` per
128x128 block (DeepSeek-V3, Qwen3-FP8; ``quant_method: "fp8"`` with ``weight_block_size``).

>>> name, reads("/nonexistent")
('fp8-blocks', False)
"""

from __future__ import annotations

from . import _folder, _serving
from .describe import describe_folder

name = "fp8-blocks"
#: config.json's quant_method of this format.
QUANT_METHOD = "fp8"

check, quantize, dequantize = _serving.check, _serving.quantize, _serving.dequantize


def reads(src) -> bool:
    return _folder.quant_method(src) == QUANT_METHOD


def describe(src) -> dict:
    return describe_folder(src, name)
