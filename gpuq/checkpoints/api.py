"""The checkpoint engine's functions: what ``gpuq quantize|dequantize|compare|example`` do,
from Python, without printing (unless ``progress``) or exiting.

Each keyword is the command's flag with dashes as underscores, with the flag's default; a
warning reaches the caller as :class:`GpuqWarning` (``warnings.warn``); a bad argument raises
ValueError/TypeError naming it before anything is written; an exception inside the call
(``KeyboardInterrupt`` included) leaves OUT as it was and propagates. No signal handler is
installed: a SIGTERM under Python's default handler ends the process at once and may leave the
run's hidden staging files (``.NAME.*.tmp`` beside OUT's files, or OUT's hidden staged
shards), which are safe to remove.
"""

from __future__ import annotations

import os
import types
import warnings

from ..qparams import METHODS
from .convert import DEQUANTIZE_DTYPES
from .quantized import CODE_DTYPES
from .scale_rules import SCALE_RULES, SCALES
from .selection import DEFAULT_MIN_SIZE
from .formats import for_input, for_output
from .formats.ct_presets import check_preset
from .formats.ct_presets import resolve as resolve_preset

__all__ = ["GpuqWarning", "quantize", "dequantize", "inspect", "compare", "example"]

_NONFINITE = ("error", "warn", "allow")
_DEVICES = ("auto", "cpu", "cuda")


class GpuqWarning(UserWarning):
    """A warning of a checkpoint run (NaN/Inf in a tensor, a scheme vLLM will not load, ...)."""


def _warn(text: str) -> None:
    warnings.warn(text, GpuqWarning, stacklevel=3)


def _path(value, name: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__}")
    return os.fspath(value)


def _choice(value, name: str, choices, none=False):
    if (value is None and none) or (isinstance(value, str) and value in choices):
        return value
    raise ValueError(f"{name} must be one of {', '.join(choices)}{' or None' if none else ''}, "
                     f"got {value!r}")


def _int(value, name: str, none=True):
    if (value is None and none) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"{name} must be an int{' or None' if none else ''}, got {type(value).__name__}")


def _bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return value


def _patterns(value, name: str) -> list:
    if isinstance(value, str):
        value = [value]
    value = list(value or ())
    if not all(isinstance(p, str) for p in value):
        raise TypeError(f"{name} must be a glob or a list of globs (str)")
    return value


def _progress(value):
    if isinstance(value, bool) or callable(value):
        return value
    raise TypeError(f"progress must be False, True or a callable (done, total, name), "
                    f"got {type(value).__name__}")


def _block(value):
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"{value[0]}x{value[1]}"
    raise TypeError(f"block must be 'AxB' or a pair of ints, got {value!r}")


def quantize_options(src, out, *, format="gpuq", dtype=None, axis=None, per_tensor=False,
                     group_size=None, block=None, symmetric=False, asymmetric=False, include=(),
                     exclude=(), min_size=DEFAULT_MIN_SIZE, calibrate="minmax", nonfinite="warn",
                     device="auto", workers=None, scheduler=None, scales=None, scale_rule=None,
                     preset=None):
    """The options namespace of :func:`quantize` (the command's ``args``), every value checked.

    >>> quantize_options("a.safetensors", "b.safetensors", group_size=128).group_size
    128
    """
    opts = types.SimpleNamespace(
        input=_path(src, "src"), output=_path(out, "out"), format=for_output(format).name,
        dtype=_choice(dtype, "dtype", CODE_DTYPES, none=True), axis=_int(axis, "axis"),
        per_tensor=_bool(per_tensor, "per_tensor"), group_size=_int(group_size, "group_size"),
        block=_block(block), symmetric=_bool(symmetric, "symmetric"),
        asymmetric=_bool(asymmetric, "asymmetric"), include=_patterns(include, "include"),
        exclude=_patterns(exclude, "exclude"), min_size=_int(min_size, "min_size", none=False),
        calibrate=_choice(calibrate, "calibrate", METHODS),
        nonfinite=_choice(nonfinite, "nonfinite", _NONFINITE), device=_choice(device, "device", _DEVICES),
        workers=_int(workers, "workers"), scheduler=scheduler,
        scales=_choice(scales, "scales", SCALES, none=True),
        scale_rule=_choice(scale_rule, "scale_rule", SCALE_RULES, none=True),
        preset=None if preset is None else check_preset(preset))
    rules = getattr(for_output(opts.format), "SCALE_RULES", None)  # a format with its own rules
    if opts.scale_rule is not None and rules is not None and opts.scale_rule not in rules:
        raise ValueError(f"scale_rule for format={opts.format!r} must be one of {', '.join(rules)}, "
                         f"got {opts.scale_rule!r}")
    if opts.symmetric and opts.asymmetric:
        raise ValueError("symmetric and asymmetric: give one")
    if opts.per_tensor and opts.axis is not None:
        raise ValueError("per_tensor and axis: give one")
    if opts.per_tensor and opts.block is not None or opts.axis is not None and opts.block is not None:
        raise ValueError("block, axis and per_tensor each say which elements share a scale: give one")
    if scheduler is not None and not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be an address (str), got {type(scheduler).__name__}")
    if opts.scheduler is not None and opts.workers is not None:
        raise ValueError("scheduler and workers: give one")
    return opts


def quantize(src, out, *, format="gpuq", dtype=None, axis=None, per_tensor=False, group_size=None,
             block=None, symmetric=False, asymmetric=False, include=(), exclude=(),
             min_size=DEFAULT_MIN_SIZE, calibrate="minmax", nonfinite="warn", device="auto",
             workers=None, scheduler=None, scales=None, scale_rule=None, preset=None, progress=False) -> dict:
    """Quantize checkpoint ``src`` (a file, a sharded folder or a model folder) to ``out``;
    return the report (what ``gpuq quantize --json`` prints).

    The keywords are ``gpuq quantize``'s flags: ``axis=None`` means no ``--axis`` (each tensor
    gets its default scheme), ``per_tensor=True`` one scale per tensor, ``group_size`` groups
    along the input dimension, ``block="AxB"`` (or ``(A, B)``) block scales; ``format`` is
    ``"gpuq"`` (``src``'s own file format), ``"compressed-tensors"``, ``"fp8-blocks"`` or
    ``"gpt-oss-mxfp4"`` (model folders; gpt-oss takes an MX ``scale_rule``). ``scales`` (``"float32"``, ``"mx"``, ``"nvfp4"``) and ``scale_rule`` (``"full"``,
    ``"narrow"``, an MX rule) are ``--scales`` and ``--scale-rule``: None takes the code type's
    default (symmetric int4/uint4: ``"full"``; int8/uint8: ``"narrow"``; fp4/fp6: MX ``"even"``).
    ``preset`` one of llm-compressor's preset names (``"W4A16"``, ``"NVFP4A16"``,
    ``"MXFP4A16"``, ...: README's table) writes that compressed-tensors folder (a scheme keyword
    beside it is refused; ``format`` may stay ``"gpuq"``). ``progress``: False, True (a tqdm bar on stderr) or ``callable(done, total, name)``.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = example(os.path.join(d, "tiny.safetensors"))
    >>> r = quantize(os.path.join(d, "tiny.safetensors"), os.path.join(d, "q.safetensors"))
    >>> r["command"], r["total"]["quantized"]
    ('quantize', 16)
    """
    opts = quantize_options(src, out, format=format, dtype=dtype, axis=axis, per_tensor=per_tensor,
                            group_size=group_size, block=block, symmetric=symmetric,
                            asymmetric=asymmetric, include=include, exclude=exclude,
                            min_size=min_size, calibrate=calibrate, nonfinite=nonfinite,
                            device=device, workers=workers, scheduler=scheduler, scales=scales,
                            scale_rule=scale_rule, preset=preset)
    return run_quantize(opts, progress=_progress(progress), warn=_warn)


def _recorded(warn):
    """``(lines, warn')``: ``warn'`` passes each warning on to ``warn`` and keeps it in ``lines``."""
    lines = []

    def record(text):
        lines.append(text)
        warn(text)

    return lines, record


def run_quantize(opts, *, progress, warn) -> dict:
    """:func:`quantize` on a checked options namespace, warnings to ``warn(text)`` (the command's
    way in); the report's ``warnings`` lists them."""
    resolve_preset(opts)
    fmt = for_output(opts.format)
    fmt.check(opts)
    lines, record = _recorded(warn)
    report = fmt.quantize(opts, warn=record, progress=progress)
    report["warnings"] = lines
    return report


def dequantize(src, out, *, dtype=None, nonfinite="warn", device="auto", progress=False) -> dict:
    """Write the float checkpoint of quantized ``src`` to ``out``; return the report (what
    ``gpuq dequantize --json`` prints). ``dtype=None``: each tensor's source dtype (a model
    folder: config.json's); ``progress`` as for :func:`quantize`.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = example(os.path.join(d, "tiny.safetensors"))
    >>> _ = quantize(os.path.join(d, "tiny.safetensors"), os.path.join(d, "q.safetensors"))
    >>> dequantize(os.path.join(d, "q.safetensors"), os.path.join(d, "f.safetensors"))["command"]
    'dequantize'
    """
    opts = types.SimpleNamespace(input=_path(src, "src"), output=_path(out, "out"),
                                 dtype=_choice(dtype, "dtype", DEQUANTIZE_DTYPES, none=True),
                                 nonfinite=_choice(nonfinite, "nonfinite", _NONFINITE),
                                 device=_choice(device, "device", _DEVICES))
    return run_dequantize(opts, progress=_progress(progress), warn=_warn)


def run_dequantize(opts, *, progress, warn) -> dict:
    """:func:`dequantize` on a checked options namespace (the command's way in)."""
    lines, record = _recorded(warn)
    report = for_input(opts.input).dequantize(opts, warn=record, progress=progress)
    report["warnings"] = lines
    return report


def inspect(src) -> dict:
    """What checkpoint ``src`` is, from its headers and config (the weights are not read):
    ``format`` (gpuq, compressed-tensors, fp8-blocks, gpt-oss-mxfp4, or dense), ``quant_method`` and
    ``config_groups`` where config.json has them, ``shards``, ``tensors`` (name, shape, dtype,
    role: quantized / parameter / kept, scheme) and ``dequantize_dtype`` (what
    :func:`dequantize` writes: a model folder's dtype, or the source dtypes of gpuq's tensors).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = example(os.path.join(d, "tiny.safetensors"))
    >>> inspect(os.path.join(d, "tiny.safetensors"))["format"]
    'dense'
    """
    src = _path(src, "src")
    return for_input(src).describe(src)


def compare(src, *, scheme=(), include=(), exclude=(), min_size=DEFAULT_MIN_SIZE,
            calibrate=("minmax",), device="auto") -> dict:
    """``gpuq compare``: the SQNR of each tensor under each ``scheme`` (``DTYPE[:gG][:axisK]...``
    specs, default int8, int4 g128 and fp8), nothing written; the report ``--json`` prints.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = example(os.path.join(d, "tiny.safetensors"))
    >>> len(compare(os.path.join(d, "tiny.safetensors"), scheme=["int8"])["schemes"])
    1
    """
    from .comparison import parse_scheme, run_compare
    from .env import pick_device

    src = _path(src, "src")
    schemes = _patterns(scheme, "scheme")
    calibrate = tuple(dict.fromkeys(_choice(c, "calibrate", METHODS)
                                    for c in _patterns(calibrate, "calibrate"))) or ("minmax",)
    if _int(min_size, "min_size", none=False) < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    for text in schemes:  # every spec checked before IN is opened
        parse_scheme(text)
    return run_compare(src, schemes, include=_patterns(include, "include"),
                       exclude=_patterns(exclude, "exclude"), min_size=min_size,
                       device=pick_device(_choice(device, "device", _DEVICES)), calibrate=calibrate)


def example(out=None, *, model_dir=None, dtype="bfloat16", seed=0) -> dict:
    """``gpuq example``: write a small random checkpoint file ``out``, or a model folder
    ``model_dir`` (one of them); return what was written (path, tensors, parameters, dtype, bytes).

    >>> import os, tempfile
    >>> example(os.path.join(tempfile.mkdtemp(), "t.safetensors"))["dtype"]
    'bfloat16'
    """
    from .example_data import write_example, write_model_dir

    if (out is None) == (model_dir is None):
        raise ValueError("example takes out (a checkpoint file) or model_dir, one of them")
    dtype = _choice(dtype, "dtype", ("bfloat16", "float16", "float32"))
    _int(seed, "seed", none=False)
    if model_dir is not None:
        return write_model_dir(_path(model_dir, "model_dir"), dtype=dtype, seed=seed)
    return write_example(_path(out, "out"), dtype=dtype, seed=seed)

