"""``gpuq quantize MODEL_DIR -o OUT_DIR --format compressed-tensors | fp8-blocks``.

The schemes each format takes (anything else is one line, exit 2, before IN is read):

=====================  ================================================================================
``--format``           ``--dtype`` and scheme
=====================  ================================================================================
compressed-tensors     ``int8`` (default): per output channel, symmetric (W8A16); ``int4``: groups of
                       128 along the input (default), ``--group-size G``, or ``--axis 0`` per channel;
                       ``--asymmetric`` adds zero points (both); ``float8_e4m3fn``: per output
                       channel (default) or ``--per-tensor``, symmetric. int codes are
                       ``pack-quantized``, fp8 ``naive-quantized``
fp8-blocks             ``float8_e4m3fn`` (default and only): one float32 scale per 128 x 128 block
                       (``weight_scale_inv``), ragged at the edges
=====================  ================================================================================

Scales are stored in the model's dtype (``config.json``'s ``dtype``, ``torch_dtype`` in older
configs, else the weights' own) as vLLM allocates them, so they are chosen with
``choose_qparams(scale_dtype=...)`` and the codes, the zero points and the report's SQNR
describe exactly what is stored; fine-grained fp8's are float32. Which weights, the ``ignore``
list and the vLLM column: :mod:`.selection`. The folder is written shard by shard, all or
nothing (:mod:`.folder`): each output shard holds what its input shard held, a quantized
weight's tensors in its place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import numpy as np

from ..._qoptions import RULE_SCALE_DTYPES
from ..convert import (count_nonfinite, error_stats, finish_report, finite_part, host_codes, progress_bar,
                       sqnr_db)
from .. import fused, fused_stream
from ..files import Checkpoint, CliError, check_header_size, checkpoint_writer, safetensors_layout
from ..report import nonfinite_text
from ..scale_rules import resolve, rule_note
from ..selection import is_float
from ..sharded import output_shard_entries
from ..fused import Buffers
from .folder import CONFIG, ModelFolder, model_output, module_notes
from .formats import WeightScheme
from .selection import FUSED, ROUTER, choose, module_of, vllm_check

#: The dtypes a model's scales may be stored in (the model's dtype).
_SCALE_DTYPES = ("bfloat16", "float16", "float32")


class Request:
    """The scheme a run asks for, checked against its format before any file is read (each
    format module builds its own: :mod:`gpuq.checkpoints.formats`): ``format`` (its name, for
    messages), ``code`` (a row), ``strategy``, ``group_size``, ``symmetric``, ``layout`` (the
    format's :class:`~gpuq.checkpoints.serving.formats.Layout`), ``block`` (a block strategy's shape),
    ``scale_dtype`` (the scales' own dtype where the layout fixes it: MX's e8m0, NVFP4's e4m3;
    None: the model's), ``scale_rule`` (MX) and ``preset`` (compressed-tensors' preset name).

    >>> from gpuq.checkpoints.formats.fp8_blocks import FP8_BLOCK, FP8_BLOCKS
    >>> from gpuq.checkpoints.serving.formats import fp8_code
    >>> Request("fp8-blocks", fp8_code(), "block", None, True, FP8_BLOCKS, FP8_BLOCK).scheme("float32").describe()
    'float8_e4m3fn block 128x128'
    """

    def __init__(self, fmt, code, strategy, group_size, symmetric, layout, block=None, *, scale_dtype=None,
                 scale_rule=None, preset=None):
        self.format, self.code, self.strategy = fmt, code, strategy
        self.group_size, self.symmetric, self.layout, self.block = group_size, symmetric, layout, block
        self.scale_dtype, self.scale_rule, self.preset = scale_dtype, scale_rule, preset

    def scheme(self, scale_dtype) -> WeightScheme:
        return WeightScheme(self.code, self.strategy, self.symmetric, self.scale_dtype or scale_dtype, self.layout,
                            group_size=self.group_size, block=self.block, scale_rule=self.scale_rule,
                            preset=self.preset)


def check_local(args) -> None:
    """A serving format's run is local: no ``--scheduler``/``--workers``."""
    if args.scheduler is not None or args.workers is not None:
        raise CliError(f"--format {args.format} runs on this machine: drop --scheduler/--workers")


def with_rule(request: Request, args, scheme: WeightScheme) -> WeightScheme:
    """``scheme`` with the scale rule ``--scales``/``--scale-rule`` ask for (symmetric int4: the
    full range by default; :mod:`gpuq.checkpoints.scale_rules`); the serving formats store
    float scales in the model's dtype: ``--scales mx``/``nvfp4`` is one CliError line."""
    if scheme.scale_dtype in RULE_SCALE_DTYPES:  # MX / NVFP4 layouts: their rule is the request's
        return scheme
    scales, rule = resolve(request.code.name, request.symmetric, getattr(args, "scales", None),
                           getattr(args, "scale_rule", None))
    if scales != "float32":
        raise CliError(f"--scales {scales}: --format {args.format} stores its scales in the model's dtype "
                       f"(float32 scales rounded to it); MX and NVFP4 scales go to gpuq's format")
    return dataclasses.replace(scheme, scale_rule=rule)


def run(args, request: Request, fmt, *, warn, progress, device) -> dict:
    """``gpuq quantize`` to the serving format ``fmt`` (its module: the hooks of
    :class:`gpuq.checkpoints.formats._serving.ServingFormat`), ``args`` as
    :mod:`gpuq.cli.commands` parses them.

    Returns the report (:func:`gpuq.checkpoints.convert.finish_report`'s, with the format, each row's
    vLLM column, the ``ignore`` list and notes).
    """
    check_local(args)
    if args.min_size < 0:
        raise CliError(f"--min-size must be >= 0, got {args.min_size}")
    model = ModelFolder(args.input)
    if model.config.get("quantization_config") is not None or any(m is not None for m in model.metas.values()):
        raise CliError(f"IN {args.input!r} is already quantized (config.json has a quantization_config, "
                       f"or its weights carry gpuq metadata); dequantize it first")
    scheme = with_rule(request, args, request.scheme(fmt.scale_dtype(model)))

    def scheme_for(name, shape):
        return scheme.layout.refuses(shape, scheme) or scheme

    chosen, kept, ignore = choose(model.specs, model.config, scheme_for, include=args.include,
                                  exclude=args.exclude, min_size=args.min_size)
    layouts = _plan_shards(model, chosen, args.output)
    present = {module_of(n) for n in model.specs}
    config = fmt.config(model.config, scheme, ignore)
    shared = shared_global_scales(model, chosen) if scheme.layout.global_scale else {}
    rows = []
    names = model.shards + ([model.index_name] if model.index_name else []) + [CONFIG] + model.others
    bar = progress_bar(len(model.specs), progress, "quantize")
    try:
        with model_output(args.output, model, names) as out:
            for shard in model.shards:
                rows += _quantize_shard(model, shard, out.staged(shard), layouts[shard], chosen, kept, device,
                                        args.nonfinite, warn, present, bar, args.calibrate, shared)
            out.copy_others(model)
            entries = {s: output_shard_entries(out.staged(s)) for s in model.shards} if model.index_name else None
            out.commit(model.shards + model.others, model if model.index_name else None, entries, config)
    finally:
        bar.close()
    report = finish_report("quantize", args.input, args.output, device.name, rows)
    report.update(format=args.format, calibrate=args.calibrate, ignore=ignore, left_out=model.left_out,
                  modules=model.modules, extra_column=("vLLM", "vllm"), scale_rule=scheme.scale_rule,
                  notes=rule_note(scheme.scale_rule, scheme.code.name)
                  + _notes(kept, model.left_out, fmt.IGNORE_KEY) + fmt.column_notes(request)
                  + _fused_note(model.specs, args.format) + fmt.load_notes(chosen, model.specs, request)
                  + module_notes(model))
    return report


def model_dtype(model: ModelFolder) -> str:
    """The dtype the model's scales are stored in: config.json's, else its weights'."""
    named = model.config.get("dtype", model.config.get("torch_dtype"))
    if named in _SCALE_DTYPES:
        return named
    floats = sorted({dt.name for shape, dt in model.specs.values() if len(shape) == 2 and dt.name in
                     _SCALE_DTYPES + ("float64",)})
    if len(floats) != 1 or floats[0] not in _SCALE_DTYPES:
        raise CliError(f"the model's dtype is not bfloat16, float16 or float32 (config.json says "
                       f"{named!r}, its weights are {', '.join(floats) or 'not floating'}): "
                       f"compressed-tensors stores scales in the model's dtype")
    return floats[0]


def _plan_shards(model, chosen, out_path) -> dict:
    """``{shard: entries}`` of every output shard (each checked against the header limit),
    refusing an output name that is already a tensor of the model."""
    layouts = {}
    for shard in model.shards:
        entries = {}
        for name in model.tensors[shard]:
            if name not in chosen:
                entries[name] = model.specs[name]
                continue
            scheme = chosen[name]
            new = scheme.layout.entries(module_of(name), model.specs[name][0], scheme)
            clash = [n for n in new if n != name and n in model.specs]
            if clash:
                raise CliError(f"tensor {name!r} cannot be quantized: IN already has a tensor named "
                               f"{clash[0]!r}, where its quantized form would go")
            entries.update(new)
        header = safetensors_layout(entries, None, model.extra[shard])[0]
        check_header_size(os.path.join(out_path, shard), header, entries)
        layouts[shard] = entries
    return layouts


def shared_global_scales(model, chosen) -> dict:
    """``{weight name: global scale}`` of the parts of each merged layer (q/k/v, gate/up, each
    expert's gate/up: :data:`~.selection.FUSED`) quantized together: :func:`gpuq.global_scale`
    of the group's largest ``max |x|`` (finite values), in the dtype of the weight that holds it,
    as llm-compressor links them (vLLM takes the largest of a merged layer's and only warns when
    they differ). A first read pass over those weights, one at a time, each read in place from
    the page cache (a memory map) by a compiled max over its stored bits: the group's scale
    needs every member's max before any code is written, so this read is inherent.

    >>> shared_global_scales(None, {})
    {}
    """
    import gpuq

    groups = {}
    for name in chosen:
        parent, _, last = module_of(name).rpartition(".")
        merged = next((m for m, parts in FUSED.items() if last in parts), None)
        if merged is not None:
            groups.setdefault((parent, merged), []).append(name)
    out = {}
    opened = {}  # one Checkpoint a shard, open for the whole pass
    try:
        for members in groups.values():
            if len(members) < 2:
                continue
            amax, dtype = max(((_finite_amax(model, n, opened), model.specs[n][1]) for n in members),
                              key=lambda t: t[0])
            out.update(dict.fromkeys(members, gpuq.global_scale(amax=amax, float_dtype=dtype)))
    finally:
        for ckpt in opened.values():
            ckpt.close()
    return out


def _finite_amax(model, name, opened, block=1 << 22) -> np.float32:
    """``max |x|`` over the finite values of tensor ``name``, as float32. The tensor is read
    in place (a memory map of the file's pages: no copy) by the compiled reduction, rows
    shared among the host threads; ``opened`` caches each shard's open Checkpoint."""
    path = model.shard_path(model.weight_map[name])
    if path not in opened:
        opened[path] = Checkpoint(path)
    x = opened[path].mapped(name)
    amax = fused.finite_amax(x)  # the compiled reduction where it serves
    if amax is not None:
        return amax
    rows = max(1, block // max(1, x.size // max(1, x.shape[0])))
    amax = np.float32(0)
    for r0 in range(0, x.shape[0], rows):
        a = np.abs(x[r0:r0 + rows].astype(np.float32))
        with np.errstate(invalid="ignore"):
            a = a[np.isfinite(a)]
        if a.size:
            amax = max(amax, np.float32(a.max()))
    return amax


def _quantize_shard(model, shard, path, entries, chosen, kept, device, nonfinite, warn, present, bar,
                    method, shared) -> list:
    """The rows of one shard, its tensors written to ``path`` in file order. On ``--device cuda``
    the weights the GPU's pass takes stream through it (:func:`gpuq.checkpoints.fused_stream.shard_weights`:
    read into pinned buffers, one weight's read overlapping the GPU's work on the one before,
    the outputs written from pinned buffers); every other tensor takes the host's path in its
    turn (while the GPU has the weight after it), and so does a weight the pass refuses
    (:func:`quantize_weight`, from the bytes read)."""
    rows = []
    buffers = Buffers()  # the code buffers, reused from weight to weight (the input is mapped)
    with Checkpoint(model.shard_path(shard)) as ckpt, \
            checkpoint_writer(path, "safetensors", entries, None, model.extra[shard]) as w, \
            contextlib.closing(_shard_stream(ckpt, chosen, device, method, shared)) as stream:
        for name, done in stream:
            shape, dtype = model.specs[name]
            row = {"name": name, "shape": list(shape), "dtype": dtype.name, "bytes_before": ckpt.nbytes(name)}
            if name not in chosen:
                w.copy_from(name, ckpt)  # file to file in the kernel where it can
                router = kept.get(name) == ROUTER  # its own row in the table: no vLLM rule applies
                rows.append({**row, "quantized": False, "scheme": None, "bytes_after": row["bytes_before"],
                             "sqnr_db": None, "max_abs_error": None, "nonfinite": None,
                             "vllm": "-" if router else None, **({"reason": ROUTER} if router else {})})
                bar.update(1, name)
                continue
            scheme = chosen[name]
            if done is not None and not done.failed:  # the GPU's pass
                tensors, stats, counts = fused_stream.weight_outputs(done, scheme, module_of(name), shape)
                _check_nonfinite(counts, name, nonfinite, warn)
            else:
                x = done.x if done is not None else ckpt.mapped(name)
                tensors, stats, counts = quantize_weight(x, scheme, device, name, nonfinite, warn, method,
                                                         shared.get(name), buffers=buffers)
            for n, t in tensors.items():
                w.write(n, t)
            rows.append({**row, "quantized": True, "scheme": _scheme_json(scheme),
                         "scheme_text": scheme.describe(),
                         "bytes_after": int(sum(t.nbytes for t in tensors.values())),
                         "sqnr_db": sqnr_db(stats["signal"], stats["error"]),
                         "max_abs_error": stats["max_abs_error"], "nonfinite": counts,
                         "vllm": vllm_check(module_of(name), shape, scheme, present),
                         "_signal": stats["signal"], "_error": stats["error"]})
            bar.update(1, name)
    return rows


def _shard_stream(ckpt, chosen, device, method, shared):
    """``(name, GPU result or None)`` for each tensor of ``ckpt`` in file order: the GPU's stream
    on a CUDA device (NVFP4's ``shared`` global scales given to it), every name with None elsewhere."""
    if device.name == "cuda":
        return fused_stream.shard_weights(ckpt, chosen, device, method, shared)
    return ((name, None) for name in ckpt.names)


def quantize_weight(x, scheme: WeightScheme, device, name, nonfinite="warn", warn=None, method="minmax",
                    global_scale=None, buffers=None) -> tuple:
    """``(tensors, stats, counts)``: the stored tensors of one ``[out, in]`` weight, its error
    statistics (:func:`gpuq.checkpoints.convert.error_stats`) and its NaN/Inf counts.

    Where :func:`gpuq.checkpoints.fused.covers` the case, one compiled pass gives the same
    bytes (:mod:`gpuq.checkpoints.fused`; its codes go in ``buffers``, a
    :class:`~gpuq.checkpoints.fused.Buffers`, where given: valid until the next weight);
    otherwise the multi-pass path below.

    Parameters come from the finite values (NaN/Inf replaced by 0, which changes no range that
    includes 0, nor ``max |x|``) by ``method`` (``--calibrate``: min/max or the MSE search),
    rounded to the scale dtype; the codes from ``x`` itself. A layout with a global scale
    (NVFP4) uses ``global_scale`` (a merged layer's, :func:`shared_global_scales`), else the
    weight's own (:func:`gpuq.global_scale`).

    >>> from gpuq.checkpoints.env import HostDevice
    >>> x = np.array([[0.5, -1.0], [2.0, 4.0]], np.float32)
    >>> from gpuq.checkpoints.formats.compressed_tensors import PACK
    >>> from gpuq.checkpoints.serving.formats import int_code
    >>> s = WeightScheme(int_code(8), "channel", True, "float32", PACK)
    >>> t, stats, _ = quantize_weight(x, s, HostDevice(), "m.weight")
    >>> sorted(t), t["m.weight_scale"].ravel().tolist()
    (['m.weight_packed', 'm.weight_scale', 'm.weight_shape'], [0.007874015718698502, 0.031496062874794006])
    """
    import gpuq

    if fused.covers(x, scheme, device, method):
        done = fused.quantize_weight(x, scheme, module_of(name), buffers=buffers, method=method, device=device,
                                     global_scale=global_scale)
        if done is not None:
            _check_nonfinite(done[2], name, nonfinite, warn)
            return done
    counts = count_nonfinite(x)
    bad = sum(counts.values())
    _check_nonfinite(counts, name, nonfinite, warn)
    kw = scheme.api_kwargs()
    code = scheme.code.name
    try:
        xd = device.put(x)
        pd = device.put(finite_part(x)) if bad else xd
        two_level = {}
        if scheme.layout.global_scale:
            two_level["global_scale"] = gpuq.global_scale(pd) if global_scale is None else global_scale
        scales, zps = gpuq.choose_qparams(pd, dtype=code, symmetric=scheme.symmetric,
                                          scale_dtype=scheme.scale_dtype, method=method, **kw,
                                          **scheme.qparams_kwargs(), **two_level)
        q = gpuq.quantize(xd, scales, zps, dtype=code, **kw, **two_level)
    except CliError:  # a ValueError already in its one-line form
        raise
    except (ValueError, TypeError) as exc:
        raise CliError(f"tensor {name!r}: {' '.join(str(exc).split())}") from exc
    del xd, pd
    scales = np.asarray(device.get(scales), np.float32)
    zps = None if zps is None else np.asarray(device.get(zps), np.int32)
    gs = two_level.get("global_scale")
    # NVFP4's weights are e2m1(q) * float32(s_b / gs): the statistics' scales
    stats = _stats(x, q, scales if gs is None else (scales / np.float32(gs)).astype(np.float32), zps, scheme,
                   device, bool(bad))
    codes = host_codes(q, device)
    if isinstance(codes, gpuq.Codes):  # packed nibbles: one code per element for the layout
        codes = gpuq.unpack(codes)
    module = module_of(name)
    return scheme.layout.encode(module, x.shape, scheme, codes, scales, zps, **two_level), stats, counts


def _check_nonfinite(counts, name, nonfinite, warn) -> None:
    """The ``--nonfinite`` policy on a weight's NaN/Inf ``counts``: ``error`` refuses it, ``warn``
    says so through ``warn``."""
    if not sum(counts.values()):
        return
    if nonfinite == "error":
        raise CliError(f"tensor {name!r} has {nonfinite_text(counts)}; --nonfinite warn or allow "
                       f"quantizes it with parameters from its finite values")
    if nonfinite == "warn" and warn is not None:
        warn(f"tensor {name!r} has {nonfinite_text(counts)}: quantized with parameters from its finite "
             f"values; --nonfinite error refuses it, allow keeps quiet")


def _stats(x, q, scales, zps, scheme, device, finite_only) -> dict:
    """:func:`gpuq.checkpoints.convert.error_stats` of one weight, in its own scheme."""
    kw = scheme.api_kwargs()
    cli = {"axis": kw["axis"], "group_size": kw["group_size"], "block_size": kw["block_size"],
           "dtype": scheme.code.name}
    return error_stats(x, q, scales, zps, cli, get=device.get, finite_only=finite_only)


def _scheme_json(scheme: WeightScheme) -> dict:
    return {"dtype": scheme.code.name, "strategy": scheme.strategy, "group_size": scheme.group_size,
            "block": list(scheme.block) if scheme.block else None, "symmetric": scheme.symmetric,
            "scale_dtype": scheme.scale_dtype, "scale_rule": scheme.scale_rule}


def _notes(kept, left_out, where) -> list:
    """The notes on what stayed in float (listed in the config's ``where`` key) and what was not copied."""
    notes = [f"note: kept in float and listed in {where}: {module_of(name)} ({why})"
             for name, why in kept.items() if why != ROUTER]
    routers = sum(why == ROUTER for why in kept.values())
    if routers:
        notes.append(f"note: {routers} MoE router{'s' if routers > 1 else ''} kept in float and listed in {where}: "
                     f"vLLM builds them unquantized, and a quantized router loads as a random one")
    if left_out:
        notes.append(f"note: not copied into OUT: {', '.join(left_out)} (folders and weight files of "
                     f"other formats)")
    return notes


def _fused_note(specs: dict, fmt: str) -> list:
    """A note on the floating tensors of rank >= 3 (fused experts: gpt-oss's
    ``mlp.experts.gate_up_proj``), kept in float: the formats quantize Linear weights only.

    >>> import numpy as np
    >>> _fused_note({"m.experts.gate_up_proj": ((4, 8, 16), np.dtype("float32"))}, "fp8-blocks")
    ["note: kept in float: 1 tensor of rank 3 or more (m.experts.gate_up_proj): fused expert weights, not a Linear module's weight, which is what --format fp8-blocks quantizes"]
    """
    fused = [n for n, (shape, dtype) in specs.items() if len(shape) >= 3 and is_float(dtype)]
    if not fused:
        return []
    named = ", ".join(fused[:3]) + (", ..." if len(fused) > 3 else "")
    return [f"note: kept in float: {len(fused)} tensor{'s' if len(fused) > 1 else ''} of rank 3 or more "
            f"({named}): fused expert weights, not a Linear module's weight, which is what --format {fmt} "
            f"quantizes"]
