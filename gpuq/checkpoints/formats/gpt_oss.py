"""gpt-oss's own MXFP4 model folders (``openai/gpt-oss-20b``, ``-120b``): ``--format gpt-oss-mxfp4``.

Only the MoE experts are quantized. Each expert tensor ``P`` of a bf16 ``GptOssForCausalLM``
(``model.layers.L.mlp.experts.gate_up_proj`` ``[E, H, 2I]`` and ``...down_proj`` ``[E, I, H]``,
i.e. ``[E, in, out]``) is stored as ``P_blocks`` uint8 ``[E, out, in/32, 16]`` and ``P_scales``
uint8 ``[E, out, in/32]`` (:mod:`.gpt_oss_experts`: the blocks are the ``[out, in]`` weight, so
the gate and up rows stay interleaved as in the bf16 tensor); everything else (attention,
routers, embeddings, norms, ``lm_head``, the experts' biases) is copied as it is, and
``config.json`` gets ``{"quant_method": "mxfp4", "modules_to_not_convert": [...]}`` naming what
the published checkpoints leave in bf16. transformers loads such a folder as ``GptOssForCausalLM``
(dequantizing it on a CPU); vLLM serves it with its own MXFP4 MoE kernels.

Writing: each expert's ``[out, in]`` weight gets e8m0 scales per 32 inputs by the MX rule
``scale_rule`` (the array API's default, ``even``: compressed-tensors' MXFP4 rule; README compares
the rules) and e2m1 codes by round-half-to-even, one expert at a time (its ``[out, in]`` copy, its
codes and scales are the run's memory beside the kept tensors; on the host with the compiled
loops the scales, codes and report's figures come from one pass,
:func:`gpuq.checkpoints.fused.micro_bytes`). transformers' own MXFP4 quantizer
(triton_kernels' ``downcast_to_mxfp``) rounds ties away from zero under ``rceil``: its bytes are
not a goal. Reading (``gpuq dequantize``): the dense bf16 folder transformers loads as a plain
``GptOssForCausalLM``, each expert tensor ``[E, in, out]`` bit for bit
``convert_moe_packed_tensors``'s, decoded and written one expert at a time.

>>> name, reads("/nonexistent")
('gpt-oss-mxfp4', False)
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from ..._codetypes import CODE_TYPES
from ..files import Checkpoint, CliError, check_header_size, checkpoint_writer, safetensors_layout
from ..report import natural_key
from ..selection import DEFAULT_MIN_SIZE, is_float
from ..serving.formats import Layout, WeightScheme
from . import _folder
from .describe import describe_folder
from .gpt_oss_experts import BLOCK_BYTES, GROUP, dequantize_experts

name = "gpt-oss-mxfp4"
#: config.json's quant_method of this format (transformers' ``Mxfp4Config``).
QUANT_METHOD = "mxfp4"
#: The quantization_config key of the modules kept in bf16.
IGNORE_KEY = "modules_to_not_convert"
#: What the published checkpoints list there: attention, routers, embeddings, lm_head.
NOT_CONVERTED = ("model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head")
#: The ``scale_rule`` values the format takes (``gpuq.checkpoints.quantize``; the command's
#: ``--scale-rule``): the MX rules.
SCALE_RULES = ("floor", "even", "ceil", "rceil")
#: The code and scale types of the layout.
FP4, E8M0 = "float4_e2m1fn", "float8_e8m0fnu"
#: The dense expert tensors that are quantized: ``*.mlp.experts.{gate_up_proj,down_proj}``.
_EXPERT = re.compile(r"(^|\.)mlp\.experts\.(gate_up_proj|down_proj)$")
_BLOCKS, _SCALES = "_blocks", "_scales"


class Experts(Layout):
    """One gpt-oss expert tensor ``P``: ``P_blocks`` and ``P_scales`` (the module name is ``P``,
    the dense tensor's own name)."""

    name = "gpt-oss mxfp4"
    #: gpuq.checkpoints.fused: each expert's scales, codes (the blocks' bytes) and figures in one pass
    one_pass = "micro"

    def params(self, scheme):
        return (_BLOCKS, _SCALES)

    def primary(self, module, scheme):
        return module + _BLOCKS

    def companions(self, module, scheme):
        return [module + _SCALES]

    def dense_name(self, module, scheme):
        return module

    def shape(self, module, scheme, load, specs):
        e, rows, groups, _ = specs[module + _BLOCKS][0]
        return (e, groups * GROUP, rows)

    def write_dense(self, module, scheme, loader, out_dtype, device, w, nonfinite, warn) -> tuple:
        """Decode ``module`` one expert at a time into ``w`` (rows of the dense tensor); return
        ``(shape, NaN/Inf counts, bytes)``. A scale byte 255 is refused naming its tensor."""
        from ..convert import count_nonfinite, judge_restored

        shape = self.shape(module, scheme, None, loader.model.specs)
        counts = {"nan": 0, "posinf": 0, "neginf": 0}
        for e in range(shape[0]):
            blocks = loader.load_rows(module + _BLOCKS, e, e + 1)
            scales = loader.load_rows(module + _SCALES, e, e + 1)
            try:
                y = decode(blocks, scales, out_dtype.name, device, f"tensor {module + _SCALES!r}", e)
            except ValueError as exc:
                raise CliError(str(exc)) from None
            for k, v in count_nonfinite(y).items():
                counts[k] += v
            judge_restored(counts, module, out_dtype.name, "error" if nonfinite == "error" else "allow", None)
            w.write_rows(module, y, e)
        judge_restored(counts, module, out_dtype.name, nonfinite, warn)
        return shape, counts, math.prod(shape) * out_dtype.itemsize


EXPERTS = Experts()
SCHEME = WeightScheme(CODE_TYPES[FP4], "group", True, E8M0, EXPERTS, group_size=GROUP)


def decode(blocks, scales, dtype: str, device, name: str, first: int = 0):
    """The dense ``[E, in, out]`` piece of ``blocks``/``scales`` (host arrays) in ``dtype``: the
    compiled decode on the host, :func:`gpuq.dequantize` on a device (the same bits: both are
    the contract's product rounded once), transposed there. ``name`` and ``first`` (the number
    of the first expert) say where in errors.

    >>> from gpuq.checkpoints.env import HostDevice
    >>> decode(np.full((1, 1, 1, 16), 0x10, np.uint8), np.full((1, 1, 1), 127, np.uint8), "float32",
    ...        HostDevice(), "p")[0, :3, 0].tolist()
    [0.0, 0.5, 0.0]
    """
    if device.xp is np:
        return dequantize_experts(blocks, scales, dtype, name=name, first=first)
    import gpuq

    from .gpt_oss_experts import check_arrays

    e, rows, groups = check_arrays(blocks, scales, name, first)
    xp = device.xp
    out = []
    for i in range(e):
        codes = gpuq.Codes(device.put(blocks[i].reshape(-1)), (rows, groups * GROUP), FP4)
        y = gpuq.dequantize(codes, device.put(gpuq.e8m0_scales(scales[i])), axis=1, group_size=GROUP,
                            dtype=dtype)
        out.append(device.get(xp.ascontiguousarray(y.T)))
    return np.stack(out)


# --- reading --------------------------------------------------------------------------------------

def read_folder(qc: dict, specs: dict, where: str) -> tuple:
    """``({P: scheme}, what)``: every ``P_blocks`` of the folder with its ``P_scales`` in the
    published layout (uint8, ``[E, out, in/32, 16]`` and ``[E, out, in/32]``); one CliError line
    for anything else.

    >>> u8 = np.dtype("uint8")
    >>> specs = {"m.experts.down_proj_blocks": ((2, 64, 1, 16), u8), "m.experts.down_proj_scales": ((2, 64, 1), u8)}
    >>> sorted(read_folder({"quant_method": "mxfp4"}, specs, "config.json")[0])
    ['m.experts.down_proj']
    """
    kept = qc.get(IGNORE_KEY, [])
    if not isinstance(kept, list) or not all(isinstance(k, str) for k in kept):
        raise CliError(f"{where}: {IGNORE_KEY} {kept!r} is not a list of module names")
    found = {n[:-len(_BLOCKS)] for n in specs if n.endswith(_BLOCKS)}
    orphans = sorted((n for n in specs if n.endswith(_SCALES) and n[:-len(_SCALES)] not in found), key=natural_key)
    if orphans:
        raise CliError(f"tensor {orphans[0]!r} is the scales of no {_BLOCKS} tensor (gpt-oss MXFP4): IN does not "
                       f"match its config")
    for p in sorted(found, key=natural_key):
        (shape, dtype), scales = specs[p + _BLOCKS], specs.get(p + _SCALES)
        if dtype != np.uint8 or len(shape) != 4 or shape[3] != BLOCK_BYTES:
            raise CliError(f"tensor {p + _BLOCKS!r} is {dtype} {list(shape)}: gpt-oss MXFP4 blocks are uint8 "
                           f"[E, out, in/32, {BLOCK_BYTES}]")
        if scales is not None and (scales[1] != np.uint8 or tuple(scales[0]) != tuple(shape[:3])):
            raise CliError(f"tensor {p + _SCALES!r} is {scales[1]} {list(scales[0])}: the scales of "
                           f"{p + _BLOCKS!r} are uint8 {list(shape[:3])}")
    return {p: SCHEME for p in found}, "gpt-oss MXFP4"


# --- writing --------------------------------------------------------------------------------------

def scale_rule(opts) -> str:
    """The MX rule of the run: ``opts.scale_rule`` (``--scale-rule``) or the array API's default.

    >>> import types
    >>> scale_rule(types.SimpleNamespace()), scale_rule(types.SimpleNamespace(scale_rule="rceil"))
    ('even', 'rceil')
    """
    from ..._mx import DEFAULT_RULE

    rule = getattr(opts, "scale_rule", None)
    if rule is None:
        return DEFAULT_RULE
    if rule not in SCALE_RULES:
        raise CliError(f"--scale-rule {rule}: --format {name} has MX scales, whose rules are "
                       f"{', '.join(SCALE_RULES)}")
    return rule


def check(opts) -> None:
    """Refuse the options this format has no use for (one line naming them; nothing read)."""
    from ..serving.quantize import check_local

    check_local(opts)
    if opts.dtype not in (None, FP4) or opts.group_size not in (None, GROUP) or opts.asymmetric:
        raise CliError(f"--format {name} stores {FP4} codes with an e8m0 scale per {GROUP} inputs, "
                       f"symmetric: drop --dtype, --group-size and --asymmetric")
    if opts.axis is not None or opts.per_tensor or opts.block is not None:
        raise CliError(f"--format {name} has one scale per {GROUP} inputs of each expert's rows: drop "
                       f"--axis, --per-tensor and --block")
    if opts.include or opts.exclude or opts.min_size != DEFAULT_MIN_SIZE:
        raise CliError(f"--format {name} quantizes every expert tensor (*.mlp.experts.gate_up_proj, "
                       f"down_proj) and nothing else, as the published checkpoints: drop --include, "
                       f"--exclude and --min-size")
    if opts.calibrate != "minmax":
        raise CliError(f"--calibrate {opts.calibrate}: MX scales come from each block's max by "
                       f"--scale-rule; --format {name} takes --calibrate minmax only")
    scale_rule(opts)


def expert_tensors(model) -> dict:
    """``{P: (E, in, out)}`` of the dense expert tensors of a gpt-oss model folder; CliError for
    a folder that is no bf16/float gpt-oss, or whose inputs are no multiple of 32."""
    if model.config.get("model_type") != "gpt_oss":
        raise CliError(f"IN {model.path!r} is a {model.config.get('model_type')!r} model: --format {name} "
                       f"writes gpt-oss (model_type 'gpt_oss', GptOssForCausalLM) folders")
    experts = {}
    for n, (shape, dtype) in model.specs.items():
        if not _EXPERT.search(n):
            continue
        if len(shape) != 3 or not is_float(dtype):
            raise CliError(f"tensor {n!r} is {dtype} {list(shape)}: a gpt-oss expert tensor is a floating "
                           f"[experts, in, out] tensor")
        if shape[1] % GROUP:
            raise CliError(f"tensor {n!r} {list(shape)}: its input dimension {shape[1]} is no multiple of "
                           f"{GROUP}, which MXFP4 blocks need")
        clash = [p for p in (n + _BLOCKS, n + _SCALES) if p in model.specs]
        if clash:
            raise CliError(f"tensor {n!r} cannot be quantized: IN already has a tensor named {clash[0]!r}, "
                           f"where its blocks or scales would go")
        experts[n] = shape
    if not experts:
        raise CliError(f"IN {model.path!r} has no expert tensors (*.mlp.experts.gate_up_proj, down_proj) to "
                       f"quantize")
    return experts


def quantization_config() -> dict:
    """The ``quantization_config`` of the published checkpoints.

    >>> quantization_config()["modules_to_not_convert"][-1]
    'lm_head'
    """
    return {"quant_method": QUANT_METHOD, IGNORE_KEY: list(NOT_CONVERTED)}


def quantize(opts, *, warn, progress) -> dict:
    """``gpuq quantize IN -o OUT --format gpt-oss-mxfp4``: the folder written all or nothing,
    shard by shard (each output shard holds what its input shard held, an expert tensor's blocks
    and scales in its place); returns the report."""
    from ..convert import finish_report, progress_bar
    from ..env import pick_device
    from ..serving.folder import CONFIG, ModelFolder, model_output, module_notes
    from ..sharded import output_shard_entries

    check(opts)
    rule, device = scale_rule(opts), pick_device(opts.device)
    model = ModelFolder(opts.input)
    if model.config.get("quantization_config") is not None or any(m is not None for m in model.metas.values()):
        raise CliError(f"IN {opts.input!r} is already quantized (config.json has a quantization_config, "
                       f"or its weights carry gpuq metadata); dequantize it first")
    experts = expert_tensors(model)
    layouts = {}
    for shard in model.shards:
        entries = {}
        for n in model.tensors[shard]:
            if n in experts:
                e, n_in, n_out = experts[n]
                entries[n + _BLOCKS] = ((e, n_out, n_in // GROUP, BLOCK_BYTES), np.dtype(np.uint8))
                entries[n + _SCALES] = ((e, n_out, n_in // GROUP), np.dtype(np.uint8))
            else:
                entries[n] = model.specs[n]
        check_header_size(os.path.join(opts.output, shard), safetensors_layout(entries, None, model.extra[shard])[0],
                          entries)
        layouts[shard] = entries
    names = model.shards + ([model.index_name] if model.index_name else []) + [CONFIG] + model.others
    bar = progress_bar(len(model.specs), progress, "quantize")
    rows = []
    try:
        with model_output(opts.output, model, names) as out:
            for shard in model.shards:
                with Checkpoint(model.shard_path(shard)) as ckpt, \
                        checkpoint_writer(out.staged(shard), "safetensors", layouts[shard], None,
                                          model.extra[shard]) as w:
                    for n in ckpt.names:
                        if n in experts:
                            rows.append(_quantize_experts(ckpt, n, w, rule, device, opts.nonfinite, warn))
                        else:
                            w.write(n, ckpt.load(n))
                            rows.append({"name": n, "shape": list(model.specs[n][0]),
                                         "dtype": model.specs[n][1].name, "quantized": False, "scheme": None,
                                         "bytes_before": ckpt.nbytes(n), "bytes_after": ckpt.nbytes(n),
                                         "sqnr_db": None, "max_abs_error": None, "nonfinite": None})
                        bar.update(1, n)
            out.copy_others(model)
            entries = {s: output_shard_entries(out.staged(s)) for s in model.shards} if model.index_name else None
            out.commit(model.shards + model.others, model if model.index_name else None, entries,
                       {**model.config, "quantization_config": quantization_config()})
    finally:
        bar.close()
    report = finish_report("quantize", opts.input, opts.output, device.name, rows)
    report.update(format=name, scale_rule=rule, calibrate="minmax", ignore=list(NOT_CONVERTED),
                  left_out=model.left_out, modules=model.modules,
                  notes=[f"note: {len(experts)} expert tensors in gpt-oss's MXFP4 (e2m1 codes, e8m0 scales per "
                         f"{GROUP} inputs by the {rule!r} rule); the rest kept as it is, listed in "
                         f"{IGNORE_KEY} as the published checkpoints list it"] + module_notes(model))
    return report


def _quantize_experts(ckpt, n, w, rule, device, nonfinite, warn) -> dict:
    """Quantize the expert tensor ``n`` one expert at a time into ``w``; its report row."""
    import dataclasses

    from .. import fused
    from ..convert import count_nonfinite, sqnr_db
    from ..report import nonfinite_text

    shape, dtype = ckpt.spec(n)
    e_count, n_in, n_out = shape
    counts = {"nan": 0, "posinf": 0, "neginf": 0}
    signal = error = max_err = 0.0
    scheme, buffers = dataclasses.replace(SCHEME, scale_rule=rule), fused.Buffers()
    for e in range(e_count):
        x = np.ascontiguousarray(ckpt.load_rows(n, e, e + 1)[0].T)  # the expert's [out, in] weight
        # Scales, codes and figures in one pass (the same bytes): the host's compiled loops, or the GPU's kernel
        covered = fused.covers(x, scheme, device, "minmax")
        done = fused.micro_bytes(x, scheme, buffers, device=device) if covered else None
        bad = count_nonfinite(x) if done is None else done[3]
        if sum(bad.values()):
            if nonfinite == "error":
                raise CliError(f"tensor {n!r} has {nonfinite_text(bad)} (expert {e}); --nonfinite warn or "
                               f"allow quantizes it with scales from its finite values")
            for k, v in bad.items():
                counts[k] += v
        # packed e2m1 codes (input 2j in the low nibble, 2j + 1 in the high one), e8m0 bytes
        packed, scale_bytes, stats = done[:3] if done is not None else _multi_pass(x, n, e, rule, device, bad)
        signal, error = signal + stats["signal"], error + stats["error"]
        max_err = max(max_err, stats["max_abs_error"])
        w.write_rows(n + _BLOCKS, packed.reshape(1, n_out, n_in // GROUP, BLOCK_BYTES), e)
        w.write_rows(n + _SCALES, scale_bytes.reshape(1, n_out, -1), e)
    if sum(counts.values()) and nonfinite == "warn" and warn is not None:
        warn(f"tensor {n!r} has {nonfinite_text(counts)}: quantized with scales from its finite values; "
             f"--nonfinite error refuses it, allow keeps quiet")
    after = e_count * n_out * (n_in // GROUP) * (BLOCK_BYTES + 1)
    return {"name": n, "shape": list(shape), "dtype": dtype.name, "quantized": True,
            "scheme": {"dtype": FP4, "strategy": "group", "group_size": GROUP, "block": None, "symmetric": True,
                       "scale_dtype": E8M0, "scale_rule": rule},
            "scheme_text": f"{FP4} g={GROUP} e8m0 {rule}", "bytes_before": ckpt.nbytes(n), "bytes_after": after,
            "sqnr_db": sqnr_db(signal, error), "max_abs_error": max_err, "nonfinite": counts,
            "_signal": signal, "_error": error}


def _multi_pass(x, n, e, rule, device, bad) -> tuple:
    """``(packed codes, e8m0 bytes, stats)`` of expert ``e``'s ``[out, in]`` weight ``x`` by the
    array API (a GPU, NumPy-only hosts): scales from the finite values (``bad``: its counts)."""
    import gpuq

    from ..convert import error_stats, finite_part

    kw = dict(axis=1, group_size=GROUP)
    xd = device.put(x)
    pd = device.put(finite_part(x)) if sum(bad.values()) else xd
    try:
        scales, _ = gpuq.choose_qparams(pd, dtype=FP4, scale_dtype=E8M0, scale_rule=rule, **kw)
        q = gpuq.quantize(xd, scales, dtype=FP4, **kw)
    except (ValueError, TypeError) as exc:
        raise CliError(f"tensor {n!r}, expert {e}: {' '.join(str(exc).split())}") from exc
    stats = error_stats(x, q, scales, None, {**kw, "dtype": FP4}, get=device.get, finite_only=bool(sum(bad.values())))
    return np.asarray(device.get(q.data)), gpuq.e8m0_bytes(np.asarray(device.get(scales))), stats


def dequantize(opts, *, warn, progress) -> dict:
    """A gpt-oss MXFP4 folder read back to a dense one (the serving formats' reader, this
    format's :func:`read_folder`)."""
    from ..env import pick_device
    from ..serving import dequantize as _dequantize

    return _dequantize.run(opts.input, opts.output, dtype=opts.dtype, device=pick_device(opts.device),
                           progress=progress, nonfinite=opts.nonfinite, warn=warn,
                           readers={QUANT_METHOD: read_folder})


def reads(src) -> bool:
    return _folder.quant_method(src) == QUANT_METHOD


def describe(src) -> dict:
    return describe_folder(src, name, {QUANT_METHOD: read_folder})
