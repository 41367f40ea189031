"""compressed-tensors model folders (pack-quantized int4/int8, naive-, int- and float-quantized):
what vLLM, SGLang and transformers load (``docs/serving-formats.md``).

>>> name, reads("/nonexistent")
('compressed-tensors', False)
"""

from __future__ import annotations

from . import _folder, _serving
from .describe import describe_folder

name = "compressed-tensors"
#: config.json's quant_method of this format.
QUANT_METHOD = "compressed-tensors"

check, quantize, dequantize = _serving.check, _serving.quantize, _serving.dequantize


def reads(src) -> bool:
    return _folder.quant_method(src) == QUANT_METHOD


def describe(src) -> dict:
    return describe_folder(src, name)
