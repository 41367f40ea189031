"""gpuq's own format: one checkpoint file (.safetensors, .npz, .npy) or a sharded folder of them,
the scheme of each tensor in the gpuq metadata (:mod:`gpuq.checkpoints.quantized`).

A model folder (config.json) whose weights are gpuq files, or dense ones, is read back through
the folder layer (:mod:`gpuq.checkpoints.serving.dequantize`), which also names the
``quant_method`` of a folder no format reads.

>>> name, reads("/nonexistent/x.safetensors")
('gpuq', True)
"""

from __future__ import annotations

from ..cluster import import_distributed
from ..convert import run_dequantize, run_quantize
from ..env import pick_device
from ..files import CliError
from ..quantized import is_float8
from ..scale_rules import resolve, rule_note
from ..selection import Plan, default_note, parse_block
from ..sharded import is_sharded
from ..sharded_run import run_sharded_dequantize, run_sharded_quantize
from . import _folder
from .describe import describe_folder

name = "gpuq"


def reads(src) -> bool:
    """Anything the serving formats do not claim (their :func:`reads` are asked first)."""
    return True


def plan(opts) -> Plan:
    """The :class:`~gpuq.checkpoints.selection.Plan` of ``opts``, checked before IN is read."""
    if opts.group_size is not None and opts.group_size < 1:
        raise CliError(f"--group-size must be a positive integer, got {opts.group_size}")
    if opts.per_tensor and opts.group_size is not None:
        raise CliError("--group-size needs an axis to group along; drop --per-tensor")
    block = parse_block(opts.block, "--block") if opts.block is not None else None
    if block is not None and opts.group_size is not None:
        raise CliError("--block and --group-size both say which elements share a scale; give one")
    if opts.min_size < 0:
        raise CliError(f"--min-size must be >= 0, got {opts.min_size}")
    if opts.per_tensor:
        axis = None
    elif opts.axis is not None:
        axis = opts.axis
    else:
        axis = -1 if opts.group_size is not None else None
    dtype = opts.dtype or "int8"
    # fp8 (fp4, fp6) has no zero point: always symmetric (scales max |x| / max_finite).
    symmetric = opts.symmetric or is_float8(dtype)
    scales, rule = resolve(dtype, symmetric, getattr(opts, "scales", None), getattr(opts, "scale_rule", None))
    if scales != "float32" and opts.calibrate != "minmax":
        raise CliError(f"--calibrate {opts.calibrate} with --scales {scales}: MX and NVFP4 scales come "
                       f"from each block's max (the MSE search is for float32 scales)")
    return Plan(axis=axis, group_size=opts.group_size, dtype=dtype, symmetric=symmetric,
                default=not opts.per_tensor and opts.axis is None and opts.group_size is None
                and block is None, block=block, scales=scales, scale_rule=rule)


def check(opts) -> None:
    dtype = opts.dtype or "int8"
    if opts.asymmetric and is_float8(dtype):
        raise CliError(f"--asymmetric: {dtype} has no zero point (fp8 is always symmetric)")
    plan(opts)
    if opts.workers is not None and opts.workers < 1:
        raise CliError(f"--workers must be a positive integer, got {opts.workers}")
    cluster = opts.scheduler is not None or opts.workers is not None
    if cluster and not is_sharded(opts.input):  # a usage error first: installing Dask would not cure it
        raise CliError("--scheduler/--workers run the shards of a sharded IN (a folder, or its "
                       "*.index.json); IN is one file")


def quantize(opts, *, warn, progress) -> dict:
    check(opts)
    p = plan(opts)
    if opts.scheduler is not None or opts.workers is not None:
        import_distributed()  # no Dask: say how to get it before reading IN
    common = dict(include=opts.include, exclude=opts.exclude, min_size=opts.min_size,
                  progress=progress, nonfinite=opts.nonfinite, warn=warn, calibrate=opts.calibrate)
    if is_sharded(opts.input):
        report = run_sharded_quantize(opts.input, opts.output, p, device=opts.device,
                                      scheduler=opts.scheduler, workers=opts.workers, **common)
    else:
        report = run_quantize(opts.input, opts.output, p, device=pick_device(opts.device), **common)
    report["calibrate"] = opts.calibrate
    report["scales"], report["scale_rule"] = p.scales, p.scale_rule
    report["default_scheme"] = default_note(p.dtype, p.scales) if p.default else None
    if rule_note(p.scale_rule, p.dtype):
        report["notes"] = report.get("notes", []) + rule_note(p.scale_rule, p.dtype)
    return report


def dequantize(opts, *, warn, progress) -> dict:
    common = dict(dtype=opts.dtype, progress=progress, nonfinite=opts.nonfinite, warn=warn)
    if _folder.is_model_folder(opts.input):
        from ..serving.dequantize import run

        return run(opts.input, opts.output, device=pick_device(opts.device), **common)
    if is_sharded(opts.input):
        return run_sharded_dequantize(opts.input, opts.output, device=opts.device, **common)
    return run_dequantize(opts.input, opts.output, device=pick_device(opts.device), **common)


def describe(src) -> dict:
    return describe_folder(src, name)
