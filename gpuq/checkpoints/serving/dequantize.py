"""``gpuq dequantize MODEL_DIR -o OUT_DIR``: a quantized model folder back to a dense one.

What IN is comes from its ``config.json`` (``quantization_config``, or ``compression_config`` in
older compressed-tensors configs) and its weights:

==============================================  ===================================================
found                                           read as
==============================================  ===================================================
``quant_method: "compressed-tensors"``          every config group's scheme:
                                                ``pack-quantized`` int4/int8, ``naive-quantized``,
                                                ``float-quantized``, ``int-quantized``; tensor,
                                                channel, group and block scales; symmetric or not
``quant_method: "fp8"`` + ``weight_block_size``  fine-grained fp8 (``weight_scale_inv``)
no quantization_config, gpuq metadata            gpuq's own files (:func:`gpuq.checkpoints.convert.dequantize_file`)
anything else                                   one line naming what was found, exit 2
==============================================  ===================================================

A quantized module is one whose tensors say so (``M.weight_packed``, ``M.weight_scale``,
``M.weight_scale_inv``, or a float8 ``M.weight`` of a module the config does not ignore, whose
scale must then be there: raw fp8 codes are no dense weight); its scheme is the config group
whose ``targets`` match its name (``"Linear"`` matches every module, as in compressed-tensors'
model-free tools; ``re:`` prefixes are regular expressions, others exact names) and not an
``ignore`` entry. Its scales and zero points may sit in any shard: they are found through the
index. Every tensor is checked (dtypes, shapes against ``weight_shape`` and the scheme,
packing, scales finite and > 0, no quantization parameter left without its weight) before it
is used, and the output is atomic.

The output is a dense model folder: the same shard names (``M.weight`` in the shard that held
its codes), an index without the quantization parameters, ``config.json`` without
``quantization_config`` and with ``dtype`` the output's, the other files copied. Each weight is
``(q - zp) * s`` in one float32 product rounded once to the output dtype: ``--dtype``, else the
model's (``dtype``, ``torch_dtype``), else float32; gpuq's own files keep each tensor's recorded
dtype unless ``--dtype`` is given.
"""

from __future__ import annotations

import os

import numpy as np

from ..convert import (DEQUANTIZE_DTYPES, check_quantized, check_restored, dequantize_file, finish_report,
                       float_dtype, progress_bar)
from ..files import Checkpoint, CliError, checkpoint_writer
from ..report import natural_key
from ..sharded import output_shard_entries
from .folder import CONFIG, ModelFolder, Tensors, model_output, module_notes

#: The config keys that hold a quantization config (compressed-tensors wrote ``compression_config``
#: before 0.9; transformers reads both).
QC_KEYS = ("quantization_config", "compression_config")
#: Tensor name endings that are quantization parameters, never model weights.
_QPARAMS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx",
            "weight_scale_inv", "weight_global_scale", "input_scale", "input_zero_point",
            "input_global_scale", "output_scale", "k_scale", "v_scale")


def run(in_path, out_path, *, dtype, device, progress=True, nonfinite="warn", warn=None, readers=None) -> dict:
    """Dequantize the model folder ``in_path`` into ``out_path``; return the report.
    ``nonfinite`` and ``warn``: what a restored weight with NaN/Inf does
    (:func:`gpuq.checkpoints.convert.check_restored`); ``readers``: ``{quant_method: its
    format's read_folder}`` (:func:`recognise`).

    >>> import tempfile
    >>> from gpuq.checkpoints.env import HostDevice
    >>> d = tempfile.mkdtemp()
    >>> run(os.path.join(os.path.dirname(__file__), *[".."] * 3, "tests", "serving", "fixtures",
    ...     "ct-int8-w8a16-channel-sym"), os.path.join(d, "dense"), dtype=None, device=HostDevice(),
    ...     progress=False)["format"]                                              # doctest: +SKIP
    'compressed-tensors pack-quantized'
    """
    model = ModelFolder(in_path)
    qc_key = next((k for k in QC_KEYS if model.config.get(k) is not None), None)
    config = {k: v for k, v in model.config.items() if k not in QC_KEYS}
    names = model.shards + ([model.index_name] if model.index_name else []) + [CONFIG] + model.others
    bar = progress_bar(len(model.specs), progress, "dequantize")
    try:
        with model_output(out_path, model, names) as out:
            if qc_key is None:
                rows, what = _gpuq_files(model, out, dtype, device, bar, nonfinite, warn), "gpuq"
            else:
                modules, what = recognise(model, model.config[qc_key], f"{in_path}/{CONFIG}", readers)
                out_dtype = _output_dtype(dtype, model, modules)
                rows = []
                with Tensors(model) as loader:
                    for shard in model.shards:
                        rows += _dequantize_shard(model, shard, out.staged(shard), modules, loader,
                                                  out_dtype, device, bar, nonfinite, warn)
                dtype = out_dtype.name
            if dtype is not None:  # the weights' dtype is the one the config names
                config["dtype" if "dtype" in config or "torch_dtype" not in config else "torch_dtype"] = dtype
            out.copy_others(model)
            shards, entries = model.shards, None
            if model.index_name:
                entries = {s: output_shard_entries(out.staged(s)) for s in model.shards}
                # a shard that held only quantization parameters has nothing left: not written
                shards = [s for s in model.shards if entries[s]]
                entries = {s: entries[s] for s in shards}
            out.commit(shards + model.others, model if model.index_name else None, entries, config)
    finally:
        bar.close()
    report = finish_report("dequantize", in_path, out_path, device.name, rows)
    report.update(format=what, left_out=model.left_out, modules=model.modules, notes=module_notes(model))
    return report


def _output_dtype(dtype, model, modules) -> np.dtype:
    """``--dtype``, else the model's: config.json's, else the one float dtype of the tensors kept
    in float (embeddings, norms), else float32."""
    named = model.config.get("dtype", model.config.get("torch_dtype"))
    if dtype or named in DEQUANTIZE_DTYPES:
        return float_dtype(dtype or named)
    quantized = {n for m, (s, _) in modules.items() for n in [s.layout.primary(m, s)] + s.layout.companions(m, s)}
    kept = {dt.name for n, (_, dt) in model.specs.items() if n not in quantized and dt.name in DEQUANTIZE_DTYPES}
    return float_dtype(kept.pop() if len(kept) == 1 else "float32")


def recognise(model: ModelFolder, qc, where: str, readers=None) -> tuple:
    """``({module: (scheme, weight shard)}, what)`` of a quantized model folder, every module's
    tensors present; one CliError line for a config or a folder gpuq does not read.

    ``readers`` maps a ``quant_method`` to the ``read_folder(qc, specs, where)`` of the format
    module that reads it (``({module: scheme}, what)``): the format chosen for IN passes its own.

    >>> recognise(None, {"quant_method": "gptq"}, "config.json")
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: config.json: quantization_config quant_method 'gptq' is not one gpuq reads (compressed-tensors, fp8 with weight_block_size, mxfp4 of gpt-oss; or gpuq's own files)
    """
    if not isinstance(qc, dict):
        raise CliError(f"{where}: quantization_config is {type(qc).__name__}, not an object")
    method = qc.get("quant_method")
    reader = (readers or {}).get(method) if isinstance(method, str) else None
    if reader is None:
        raise CliError(f"{where}: quantization_config quant_method {method!r} is not one gpuq reads "
                       f"(compressed-tensors, fp8 with weight_block_size, mxfp4 of gpt-oss; or gpuq's own files)")
    specs = model.specs
    modules, what = reader(qc, specs, where)
    if not modules:
        raise CliError(f"{where} says {what}, but no tensor of IN is a quantized weight")
    used = set()
    planned = {}
    for m, scheme in modules.items():
        primary = scheme.layout.primary(m, scheme)
        wanted = [primary] + scheme.layout.companions(m, scheme)
        missing = [n for n in wanted if n not in specs]
        if missing:
            raise CliError(f"module {m!r} ({scheme.describe()}, {scheme.layout.__class__.__name__}): "
                           f"tensor {missing[0]!r} is missing from IN")
        dense = scheme.layout.dense_name(m, scheme)
        if primary != dense and dense in specs:
            raise CliError(f"module {m!r} holds both {primary!r} and a dense {dense!r}: which one "
                           f"is the weight?")
        used.update(wanted)
        planned[m] = (scheme, model.weight_map[primary])
    orphans = sorted((n for n in specs if n.rpartition(".")[2] in _QPARAMS and n not in used), key=natural_key)
    if orphans:
        raise CliError(f"tensor {orphans[0]!r} is a quantization parameter of no quantized weight "
                       f"({what}): IN does not match its config")
    return planned, what


def float8_weights(specs) -> set:
    """The modules whose ``M.weight`` is float8: quantized, whatever else the folder holds."""
    return {n.rpartition(".")[0] for n, (_, dtype) in specs.items()
            if n.endswith(".weight") and dtype.name.startswith("float8")}



def _dequantize_shard(model, shard, path, modules, loader, out_dtype, device, bar, nonfinite, warn) -> list:
    here = {m: s for m, (s, owner) in modules.items() if owner == shard}
    primaries = {s.layout.primary(m, s): m for m, s in here.items()}
    dropped = {n for m, (s, _) in modules.items() for n in s.layout.companions(m, s)}
    entries = {}
    for name in model.tensors[shard]:
        if name in primaries:
            m = primaries[name]
            layout = here[m].layout
            entries[layout.dense_name(m, here[m])] = (layout.shape(m, here[m], loader.load, model.specs), out_dtype)
        elif name not in dropped:
            entries[name] = model.specs[name]
    rows = []
    with checkpoint_writer(path, "safetensors", entries, None, model.extra[shard]) as w:
        for name in model.tensors[shard]:
            if name in primaries:
                m = primaries[name]
                rows.append(_dequantize_module(m, here[m], loader, out_dtype, device, w, model, nonfinite, warn))
            elif name not in dropped:
                w.write(name, loader.load(name))
                nbytes = int(np.prod(model.specs[name][0])) * model.specs[name][1].itemsize
                rows.append({"name": name, "shape": list(model.specs[name][0]), "dtype": model.specs[name][1].name,
                             "quantized": False, "bytes_before": nbytes, "bytes_after": nbytes})
            bar.update(1, name)  # after the tensor: a progress callback sees it done
    return rows


def _dequantize_module(module, scheme, loader, out_dtype, device, w, model, nonfinite, warn) -> dict:
    dense = scheme.layout.dense_name(module, scheme)
    write_dense = getattr(scheme.layout, "write_dense", None)
    if write_dense is not None:  # a layout that writes its dense tensor piece by piece (gpt-oss's experts)
        shape, counts, nbytes = write_dense(module, scheme, loader, out_dtype, device, w, nonfinite, warn)
    else:
        shape, counts, nbytes = _dequantize_whole(module, scheme, loader, out_dtype, device, w, nonfinite, warn)
    stored = [scheme.layout.primary(module, scheme)] + scheme.layout.companions(module, scheme)
    before = sum(int(np.prod(model.specs[n][0])) * model.specs[n][1].itemsize for n in stored)
    return {"name": dense, "shape": list(shape), "dtype": scheme.code.name, "quantized": True,
            "bytes_before": before, "bytes_after": nbytes, "nonfinite": counts}


def _dequantize_whole(module, scheme, loader, out_dtype, device, w, nonfinite, warn) -> tuple:
    """``(shape, NaN/Inf counts, bytes)`` of the dense weight of ``module``, decoded and written whole."""
    import gpuq

    codes, scales, zps, shape = scheme.layout.decode(module, scheme, loader.load)
    if isinstance(codes, gpuq.Codes):  # packed fp4 bytes
        src = gpuq.Codes(device.put(codes.data), codes.shape, codes.dtype)
    elif scheme.code.codec == "float8" and device.xp is not np:  # no fp8/fp6 dtype on the GPU side
        src = gpuq.Codes(device.put(codes.view(np.uint8)), codes.shape, scheme.code.name)
    else:
        src = device.put(codes)
    try:
        y = gpuq.dequantize(src, scheme.api_params(scales, shape), scheme.api_params(zps, shape),
                            dtype=out_dtype, **scheme.api_kwargs())
    except CliError:  # a ValueError already in its one-line form
        raise
    except (ValueError, TypeError) as exc:
        raise CliError(f"module {module!r}: {' '.join(str(exc).split())}") from exc
    y = device.get(y)
    dense = scheme.layout.dense_name(module, scheme)
    counts = check_restored(y, dense, nonfinite, warn)
    w.write(dense, y)
    return shape, counts, int(y.nbytes)


def _gpuq_files(model, out, dtype, device, bar, nonfinite, warn) -> list:
    """Shards written by ``gpuq quantize`` (each checked against its own gpuq metadata first)."""
    plain = [s for s, m in model.metas.items() if m is None]
    if plain:
        raise CliError(f"IN {model.path!r} is not quantized: config.json has no quantization_config and "
                       f"{plain[0]!r} carries no gpuq metadata")
    schemes = {}
    for shard in model.shards:
        with Checkpoint(model.shard_path(shard)) as ckpt:
            schemes[shard] = check_quantized(ckpt)
    rows = []
    for shard in model.shards:
        with Checkpoint(model.shard_path(shard)) as ckpt:
            rows += dequantize_file(ckpt, out.staged(shard), "safetensors", schemes[shard], dtype=dtype,
                                    device=device, tick=lambda name: bar.update(1, name), nonfinite=nonfinite,
                                    warn=warn)
    return rows
