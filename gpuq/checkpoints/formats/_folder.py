"""What a model folder's config.json says its format is, read without raising (the folder layer
of :mod:`gpuq.checkpoints.serving.folder` checks it properly when the run starts)."""

from __future__ import annotations

import json
import os

from ..serving.dequantize import QC_KEYS


def is_model_folder(src) -> bool:
    """True when ``src`` is a folder holding a config.json.

    >>> is_model_folder("/nonexistent")
    False
    """
    return isinstance(src, (str, os.PathLike)) and os.path.isfile(os.path.join(src, "config.json"))


def quant_method(src):
    """config.json's ``quantization_config.quant_method`` of a model folder (or, from older
    compressed-tensors, ``compression_config``'s: the key its dequantize reads), else None.

    >>> quant_method("/nonexistent") is None
    True
    """
    if not is_model_folder(src):
        return None
    try:
        with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        qc = next((config[k] for k in QC_KEYS if config.get(k) is not None), None)
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return qc.get("quant_method") if isinstance(qc, dict) else None
