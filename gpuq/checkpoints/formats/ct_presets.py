"""llm-compressor's preset names (compressed-tensors 0.20.0's ``PRESET_SCHEMES``) as
``gpuq quantize --preset NAME`` (``preset=`` of :func:`gpuq.checkpoints.quantize`): each a
compressed-tensors folder whose ``config_groups`` (weights and ``input_activations``) and
``format`` are what compressed-tensors writes and infers for the preset, so vLLM picks the
kernels it picks for an llm-compressor folder.

=============  ===========================================  ========================
preset         weights                                      format
=============  ===========================================  ========================
W8A16          int8, groups of 128, symmetric               pack-quantized
W4A16          int4, groups of 128, symmetric               pack-quantized
W4A16_ASYM     int4, groups of 128, zero points             pack-quantized
W8A8, INT8     int8 per channel (+ int8 per-token acts)     int-quantized
FP8_DYNAMIC    fp8 per channel (+ fp8 per-token acts)       float-quantized
FP8_BLOCK      fp8 128x128 blocks (+ fp8 acts per 128)      float-quantized
NVFP4A16       fp4, e4m3 scales per 16 + a global scale     nvfp4-pack-quantized
MXFP4A16       fp4, e8m0 scales per 32                      mxfp4-pack-quantized
MXFP4          MXFP4A16 (+ MXFP4 acts)                      mxfp4-pack-quantized
MXFP6A16       fp6 e2m3, e8m0 scales per 32                 mxfp6-pack-quantized
MXFP8A16       fp8 e4m3, e8m0 scales per 32                 mxfp8-quantized
MXFP8          MXFP8A16 (+ MXFP8 acts)                      mxfp8-quantized
=============  ===========================================  ========================

Activations are dynamic (scaled at run time by the server): nothing of them is stored. Every
other preset name is refused with the reason (:data:`REFUSED`).

>>> sorted(PRESETS) == sorted(["W8A16", "W4A16", "W4A16_ASYM", "W8A8", "INT8", "FP8_DYNAMIC",
...     "FP8_BLOCK", "NVFP4A16", "MXFP4A16", "MXFP4", "MXFP6A16", "MXFP8A16", "MXFP8"])
True
"""

from __future__ import annotations

from ..files import CliError


def _acts(bits, kind, strategy, group=None, scale_dtype=None) -> dict:
    """An ``input_activations`` entry as compressed-tensors 0.20 serializes it (dynamic)."""
    a = {"num_bits": bits, "type": kind, "symmetric": True, "group_size": group, "strategy": strategy,
         "dynamic": True}
    return a if scale_dtype is None else {**a, "scale_dtype": scale_dtype}


#: preset -> (code dtype, strategy, group size, symmetric, block, scales, input_activations);
#: ``scales`` is None (the model's dtype, a plain scale), ``"mx"`` or ``"nvfp4"``; the layout
#: (and so ``format``) follows from these, as compressed-tensors infers it.
PRESETS = {
    "W8A16": ("int8", "group", 128, True, None, None, None),
    "W4A16": ("int4", "group", 128, True, None, None, None),
    "W4A16_ASYM": ("int4", "group", 128, False, None, None, None),
    "W8A8": ("int8", "channel", None, True, None, None, _acts(8, "int", "token")),
    "INT8": ("int8", "channel", None, True, None, None, _acts(8, "int", "token")),
    "FP8_DYNAMIC": ("float8_e4m3fn", "channel", None, True, None, None, _acts(8, "float", "token")),
    "FP8_BLOCK": ("float8_e4m3fn", "block", None, True, (128, 128), None, _acts(8, "float", "group", 128)),
    "NVFP4A16": ("float4_e2m1fn", "tensor_group", 16, True, None, "nvfp4", None),
    "MXFP4A16": ("float4_e2m1fn", "group", 32, True, None, "mx", None),
    "MXFP4": ("float4_e2m1fn", "group", 32, True, None, "mx", _acts(4, "float", "group", 32, "torch.uint8")),
    "MXFP6A16": ("float6_e2m3fn", "group", 32, True, None, "mx", None),
    "MXFP8A16": ("float8_e4m3fn", "group", 32, True, None, "mx", None),
    "MXFP8": ("float8_e4m3fn", "group", 32, True, None, "mx", _acts(8, "float", "group", 32, "torch.uint8")),
}

_STATIC = "its activations need calibrated (static) scales, and gpuq quantizes without calibration data"
_MIXED = "weights and activations of different code types (a mixed preset), which gpuq does not write"
#: The other names of compressed-tensors 0.20.0's PRESET_SCHEMES, each with why gpuq refuses it.
REFUSED = {
    "UNQUANTIZED": "it quantizes nothing (the model folder is already that)",
    "FP8": _STATIC, "NVFP4": _STATIC,
    "W4AFP8": _MIXED + " (int4 weights, fp8 activations)",
    "W4A8": _MIXED + " (int4 weights, int8 activations)",
    "W4A4": "its activations are int4 per token, an activation scheme of none of the presets gpuq "
            "writes (W4A16 is its weight-only form)",
    "MXFP4XFP8": _MIXED + " (MXFP4 weights, fp8 activations)",
    "MXFP6A8": _MIXED + " (MXFP6 weights, MXFP8 activations)",
    **{f"W{w}A{a}": f"its weights are {w}-bit integers: gpuq has no {w}-bit code type (int4, int8)"
       for w, acts in ((2, (4, 8, 16)), (3, (4, 8, 16)), (5, (8, 16)), (6, (8, 16)), (7, (8, 16)))
       for a in acts},
}


def check_preset(name) -> str:
    """``name`` if gpuq writes that preset; otherwise a CliError (a ValueError) with the reason.

    >>> check_preset("MXFP4A16")
    'MXFP4A16'
    >>> check_preset("NVFP4")
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: --preset NVFP4: its activations need calibrated (static) scales, and gpuq quantizes without calibration data
    """
    if not isinstance(name, str):
        raise TypeError(f"preset must be a preset name (str) or None, got {type(name).__name__}")
    if name in PRESETS:
        return name
    why = REFUSED.get(name, "not one of compressed-tensors 0.20.0's preset names")
    raise CliError(f"--preset {name}: {why}" + ("" if name in REFUSED else
                                                f"; gpuq writes {', '.join(PRESETS)}"))


#: The scheme options a preset sets (a run giving one of them with --preset is refused).
SCHEME_FLAGS = (("dtype", "--dtype"), ("axis", "--axis"), ("per_tensor", "--per-tensor"),
                ("group_size", "--group-size"), ("block", "--block"), ("symmetric", "--symmetric"),
                ("asymmetric", "--asymmetric"), ("scales", "--scales"))


def resolve(opts) -> None:
    """A run with ``opts.preset``: checked, and its format set to compressed-tensors (the only
    format presets describe); a scheme option given beside it, or another format, refused."""
    preset = getattr(opts, "preset", None)
    if preset is None:
        return
    check_preset(preset)
    if opts.format not in ("gpuq", "compressed-tensors"):  # gpuq: the default, not a choice
        raise CliError(f"--preset {preset} writes a compressed-tensors folder, got --format {opts.format}")
    given = [flag for attr, flag in SCHEME_FLAGS if getattr(opts, attr, None) not in (None, False)]
    if given:
        raise CliError(f"--preset {preset} sets the scheme: drop {', '.join(given)}")
    opts.format = "compressed-tensors"
