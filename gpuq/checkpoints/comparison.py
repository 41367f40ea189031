"""``gpuq compare``: several code types side by side on one checkpoint, SQNR per tensor.

IN is a checkpoint file or a sharded checkpoint (a folder, or its index:
:class:`gpuq.checkpoints.sharded.ShardedCheckpoint`), read shard after shard; a model folder
with one ``model.safetensors`` is read through that file. Each
selected tensor (the same selection as ``gpuq quantize``, over the whole
model: floating, rank >= 2, ``--min-size``, ``--include``/``--exclude``) is
quantized in memory with every ``--scheme`` in turn, exactly as ``gpuq
quantize`` would with those options (:func:`gpuq.checkpoints.convert.quantize_tensor`),
and compared with its float32 dequantization; nothing is written. The default
schemes are ``gpuq quantize``'s defaults for int8, int4 and fp8 e4m3fn (one
scale per row; groups of 128 along the last dimension; one scale per row).

A scheme is ``DTYPE[:OPTION]...`` with the options ``gG`` (one scale per G
elements; along the last axis unless ``axisK`` says otherwise), ``axisK``
(per-channel along K; -1 with a group size), ``tensor`` (one scale per tensor),
``bAxB`` (one scale per AxB block of the last two dimensions, as ``gpuq quantize
--block AxB``), ``sym`` (zero point 0; implied for fp8), the scales ``float32``, ``mx`` or
``nvfp4`` and a scale rule ``full``, ``narrow``, ``floor``, ``even``, ``ceil`` or ``rceil`` (as
``gpuq quantize --scales``/``--scale-rule``, with the same defaults). Without ``gG``,
``axisK``, ``tensor`` or ``bAxB`` the scheme is the default of its code type and each tensor's rank
(:func:`gpuq.checkpoints.selection.default_scheme`)::

    int8                  int8 asymmetric, one scale per row (axis 0 at rank 2)
    int4:g128             int4 asymmetric, groups of 128 along the inputs
    uint4:g64:sym         uint4 symmetric (zero point 8), groups of 64
    float8_e4m3fn         fp8, one scale per row
    float8_e5m2:tensor    fp8 e5m2, one scale per tensor
    float8_e4m3fn:b128x128  fp8, one scale per 128x128 block (DeepSeek's layout)
    int4:sym              int4 symmetric, full-range rule (max|x| / 7.5), groups of 128
    int4:sym:narrow       int4 symmetric, max|x| / 7
    float4_e2m1fn         fp4, MX scales (rule even), groups of 32
    float4_e2m1fn:nvfp4   fp4, NVFP4's e4m3 scales per 16 and a global scale
    float6_e2m3fn:mx:ceil fp6, MX scales by the ceil rule

``calibrate`` lists the ways the parameters come from the data (``gpuq compare --calibrate``,
repeatable): ``"minmax"`` (the default) and ``"mse"`` (``choose_qparams(..., method="mse")``).
Each scheme gets one column per method, in that order; a column of a method other than
min/max alone says which in its title (``int4 asym axis=-1 g=128 mse``).
"""

from __future__ import annotations

import math
import os

from .files import Checkpoint, CliError
from .quantized import (CODE_DTYPES, codes_shape, has_global_scale, has_zps, is_float8,
                        param_shape, scales_dtype, zps_dtype)
from .scale_rules import SCALE_RULES, SCALES, resolve
from .report import _db, human_bytes, natural_key
from .selection import Plan, default_scheme, describe, describe_where, parse_block, select

DEFAULT_SCHEMES = ("int8", "int4", "float8_e4m3fn")


def parse_scheme(text: str) -> Plan:
    """A :class:`~gpuq.checkpoints.selection.Plan` from ``DTYPE[:OPTION]...`` (see the module docstring).

    >>> parse_scheme("int4:g128")  # doctest: +NORMALIZE_WHITESPACE
    Plan(axis=-1, group_size=128, dtype='int4', symmetric=False, default=False, block=None,
         scales='float32', scale_rule=None)
    >>> parse_scheme("float8_e5m2:tensor")  # doctest: +NORMALIZE_WHITESPACE
    Plan(axis=None, group_size=None, dtype='float8_e5m2', symmetric=True, default=False, block=None,
         scales='float32', scale_rule=None)
    >>> p = parse_scheme("float4_e2m1fn:nvfp4"); p.scales, p.scale_rule, p.default
    ('nvfp4', None, True)
    >>> parse_scheme("int4:sym").scale_rule, parse_scheme("int4:sym:narrow").scale_rule
    ('full', 'narrow')
    >>> parse_scheme("float8_e4m3fn:b128x128").block
    (128, 128)
    >>> parse_scheme("uint8:sym").default
    True
    >>> parse_scheme("int3")
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: --scheme 'int3': the code type 'int3' is not one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn
    """
    dtype, *options = text.split(":")
    if dtype not in CODE_DTYPES:
        raise CliError(f"--scheme {text!r}: the code type {dtype!r} is not one of "
                       f"{', '.join(CODE_DTYPES)}")
    axis = group = block = scales = rule = None
    per_tensor = symmetric = False
    for opt in options:
        try:
            if opt == "sym":
                symmetric = True
            elif opt in SCALES or opt in SCALE_RULES:
                if (scales if opt in SCALES else rule) is not None:
                    raise CliError(f"--scheme {text!r}: {opt!r} is the second "
                                   f"{'scales' if opt in SCALES else 'scale rule'} option: give one")
                scales, rule = (opt, rule) if opt in SCALES else (scales, opt)
            elif opt == "tensor":
                per_tensor = True
            elif opt.startswith("b") and "x" in opt:
                block = parse_block(opt[1:], f"--scheme {text!r}: {opt!r}")
            elif opt.startswith("axis"):
                axis = int(opt[4:])
            elif opt.startswith("g"):
                group = int(opt[1:])
                if group < 1:
                    raise ValueError
            else:
                raise ValueError
        except CliError:  # a ValueError already in its one-line form
            raise
        except ValueError:
            raise CliError(f"--scheme {text!r}: {opt!r} is not an option (gG, axisK, tensor, "
                           f"bAxB, sym, {', '.join(SCALES)}, {', '.join(SCALE_RULES)})") from None
    if sum((per_tensor, axis is not None or group is not None, block is not None)) > 1:
        raise CliError(f"--scheme {text!r}: give one of 'tensor', 'bAxB' and an axis or "
                       f"group size")
    default = not per_tensor and axis is None and group is None and block is None
    if group is not None and axis is None:
        axis = -1
    symmetric = symmetric or is_float8(dtype)
    try:
        scales, rule = resolve(dtype, symmetric, scales, rule)
    except CliError as exc:  # the flags' words, said of the spec
        raise CliError(f"--scheme {text!r}: {exc}") from None
    return Plan(axis=None if per_tensor else axis, group_size=group, dtype=dtype,
                symmetric=symmetric, default=default, block=block, scales=scales, scale_rule=rule)


def _stored_bytes(shape, scheme) -> int:
    """Bytes ``gpuq quantize`` stores for one tensor: codes, scales, zero points (NVFP4: its
    global scale)."""
    codes = math.prod(codes_shape(scheme["dtype"], shape))  # one byte per code, or packed
    params = math.prod(param_shape(tuple(shape), scheme["axis"], scheme["group_size"],
                                   scheme.get("block_size")))
    zps = params * zps_dtype(scheme["dtype"]).itemsize if has_zps(scheme) else 0
    scales = params * scales_dtype(scheme, "npz").itemsize + (4 if has_global_scale(scheme) else 0)
    return codes + scales + zps


def run_compare(in_path, scheme_texts, *, include=(), exclude=(), min_size, device,
                calibrate=("minmax",)) -> dict:
    """SQNR of every selected tensor of a checkpoint (a file or a sharded one) under each
    scheme and each method of ``calibrate``; the report."""
    from . import fused
    from .convert import quantize_tensor, sqnr_db

    texts = list(scheme_texts or DEFAULT_SCHEMES)
    # One column per (scheme, method), schemes in the order given, methods within each.
    pairs = [(t, m) for t in texts for m in calibrate]
    plans = [parse_scheme(t) for t, _ in pairs]
    columns = [t for t, _ in pairs]
    methods = [m for _, m in pairs]
    for plan, text, method in zip(plans, columns, methods):
        if plan.scales != "float32" and method != "minmax":  # before IN is read
            raise CliError(f"--scheme {text!r} with --calibrate {method}: MX and NVFP4 scales come from "
                           f"each block's max (the MSE search is for float32 scales); compare it in a "
                           f"run of its own")
    specs, tensors = _open(in_path)
    chosen = select(specs, include=include, exclude=exclude, min_size=min_size)
    schemes = {n: [p.for_shape(n, specs[n][0]) for p in plans] for n in chosen}
    rows, totals = [], [{"signal": 0.0, "error": 0.0, "bytes": 0} for _ in plans]
    before = 0
    buffers = fused.Buffers()
    for name, x in tensors(set(chosen)):
        shape, dtype = specs[name]
        before += x.nbytes
        row = {"name": name, "shape": list(shape), "dtype": dtype.name, "sqnr_db": []}
        for k, scheme in enumerate(schemes[name]):
            # The figures of the one pass where it takes the tensor (gpuq quantize's own), the
            # multi-pass path's otherwise: the same numbers as the command prints.
            done = (fused.quantize_file_tensor(x, scheme, "safetensors", buffers, methods[k])
                    if fused.covers_file(x, scheme, device, methods[k]) else None)
            try:
                stats = done[3] if done is not None else quantize_tensor(
                    x, scheme, device, name=name, nonfinite="allow", calibrate=methods[k])[3]
            except CliError:  # a ValueError already in its one-line form
                raise
            except (ValueError, TypeError) as exc:
                raise CliError(f"tensor {name!r}, --scheme {columns[k]!r}: "
                               f"{' '.join(str(exc).split())}") from exc
            row["sqnr_db"].append(sqnr_db(stats["signal"], stats["error"]))
            tot = totals[k]
            if not math.isnan(stats["signal"]):
                tot["signal"] += stats["signal"]
                tot["error"] += stats["error"]
            tot["bytes"] += _stored_bytes(shape, scheme)
        rows.append(row)
        del x
    rows.sort(key=lambda r: natural_key(r["name"]))
    return {
        "command": "compare", "input": in_path, "device": device.name,
        "calibrate": list(calibrate),
        "schemes": [{"scheme": t, "calibrate": methods[k],
                     "text": _column(plans[k], [v[k] for v in schemes.values()])
                     + ("" if calibrate == ("minmax",) else f" {methods[k]}")}
                    for k, t in enumerate(columns)],
        "tensors": rows,
        "total": {"quantized": len(rows), "bytes_before": before,
                  "sqnr_db": [sqnr_db(t["signal"], t["error"]) for t in totals],
                  "bytes_after": [t["bytes"] for t in totals]},
    }


def _open(in_path):
    """``(specs, tensors)`` of a checkpoint file or a sharded one: ``specs`` maps every name to
    ``(shape, dtype)`` (checked, no data read) and ``tensors(names)`` yields ``(name, array)``
    for those names, one at a time, in file order (shard after shard)."""
    from .sharded import INDEX_SUFFIX, ShardedCheckpoint, is_sharded

    def refuse(where):
        raise CliError(f"IN {in_path!r} is already quantized by gpuq{where}; compare its source")

    one = os.path.join(in_path, "model.safetensors")
    if os.path.isdir(in_path) and os.path.isfile(one) and not any(
            f.endswith(INDEX_SUFFIX) for f in os.listdir(in_path)):
        in_path = one  # a one-file model folder: its weights (a sharded one is read by its index)
    if is_sharded(in_path):
        src = ShardedCheckpoint(in_path)
        quantized = [s for s, m in src.metas.items() if m is not None]
        if quantized:
            refuse(f" (shard {quantized[0]!r})")
        paths = [src.shard_path(s) for s in src.shards]
        specs = src.specs
    else:
        with Checkpoint(in_path) as ckpt:
            if ckpt.meta is not None:
                refuse("")
            specs = {n: ckpt.spec(n) for n in ckpt.names}
        paths = [in_path]

    def tensors(names):
        for path in paths:
            with Checkpoint(path) as ckpt:
                for name in ckpt.names:
                    if name in names:
                        yield name, ckpt.load(name)

    return specs, tensors


def _column(plan, schemes) -> str:
    """The column title: the scheme as the quantize report words it (a negative axis as
    given); where the tensors' ranks give them different schemes, each one's granularity.

    >>> p = parse_scheme("int8")
    >>> _column(p, [p.for_shape("a", (4, 8)), p.for_shape("b", (2, 4, 8))])
    'int8 asym axis=0 | axis=(0,1)'
    >>> p = parse_scheme("int4")
    >>> _column(p, [p.for_shape("a", (4, 8)), p.for_shape("b", (2, 4, 8))])
    'int4 asym axis=-1 g=128'
    """
    if not schemes:
        return plan.dtype
    if plan.axis is not None and plan.axis < 0:
        shown = plan.axis
    elif plan.default and default_scheme(plan.dtype, 2, plan.scales)[1] is not None:
        shown = -1  # the default groups run along the last axis, whatever the rank
    else:
        shown = None
    if shown is not None:
        schemes = [dict(s, axis=shown) for s in schemes]
    wheres = list(dict.fromkeys(describe_where(s) for s in schemes))
    return " | ".join([describe(schemes[0])] + wheres[1:])


def format_compare(report: dict) -> str:
    """The comparison as a table: one SQNR column per scheme, totals and sizes below."""
    titles = [s["text"] for s in report["schemes"]]
    header = ["tensor", "shape"] + titles
    rows = [[r["name"], "x".join(map(str, r["shape"]))] + [_db(v) for v in r["sqnr_db"]]
            for r in report["tensors"]]
    tot = report["total"]
    total = [f"total: {tot['quantized']} tensors", "SQNR dB"] + [_db(v) for v in tot["sqnr_db"]]
    size = [f"stored (from {human_bytes(tot['bytes_before'])})", "bytes"] + [
        f"{human_bytes(b)} ({b / tot['bytes_before']:.0%})" if tot["bytes_before"] else "0 B"
        for b in tot["bytes_after"]]
    table = [header] + rows + [total, size]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]

    def line(r):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    title = (f"gpuq compare: {report['input']} (device: {report['device']}), SQNR dB of the "
             f"float32 dequantization")
    return "\n".join([title, "", line(header), rule] + [line(r) for r in rows]
                     + [rule, line(total), line(size)])
