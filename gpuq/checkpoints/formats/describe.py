"""What a checkpoint holds, from its headers and config only (:func:`gpuq.checkpoints.inspect`)."""

from __future__ import annotations

from ..files import Checkpoint
from ..quantized import param_suffixes
from ..report import natural_key
from ..sharded import ShardedCheckpoint, is_sharded
from . import _folder

def _headers(src):
    """``(config or None, shards, {name: (shape, dtype)}, {shard: gpuq meta}, model or None)``."""
    if _folder.is_model_folder(src):
        from ..serving.folder import ModelFolder

        m = ModelFolder(src)
        return m.config, list(m.shards), dict(m.specs), dict(m.metas), m
    if is_sharded(src):
        s = ShardedCheckpoint(src)
        return None, list(s.shards), dict(s.specs), dict(s.metas), None
    with Checkpoint(src) as c:
        return None, [src], {n: c.spec(n) for n in c.names}, {src: c.meta}, None


def describe_folder(src, fmt: str, readers=None) -> dict:
    """The :func:`gpuq.checkpoints.inspect` report of ``src``, read as format ``fmt`` (a model
    folder's ``quantization_config`` through ``readers``: ``{quant_method: read_folder}``)."""
    config, shards, specs, metas, model = _headers(src)
    qc = (config or {}).get("quantization_config")
    roles, schemes, restores = {}, {}, None
    gpuq_meta = {n: s for meta in metas.values() if meta for n, s in meta.get("tensors", {}).items()}
    if isinstance(qc, dict) and model is not None:
        from ..serving.dequantize import _output_dtype, recognise

        modules, _ = recognise(model, qc, "config.json", readers)
        for m, (scheme, _shard) in modules.items():
            roles[scheme.layout.primary(m, scheme)] = "quantized"
            schemes[scheme.layout.primary(m, scheme)] = scheme.describe()
            for c in scheme.layout.companions(m, scheme):
                roles[c] = "parameter"
        restores = _output_dtype(None, model, modules).name
    elif gpuq_meta:
        for n, s in gpuq_meta.items():
            roles[n], schemes[n] = "quantized", {k: v for k, v in s.items() if k != "source_dtype"}
            for suffix in param_suffixes(s):
                roles[n + suffix] = "parameter"
        restores = sorted({s.get("source_dtype") for s in gpuq_meta.values()} - {None})
    tensors = [{"name": n, "shape": list(specs[n][0]), "dtype": specs[n][1].name,
                "role": roles.get(n, "kept"), "scheme": schemes.get(n)}
               for n in sorted(specs, key=natural_key)]
    quantized = any(t["role"] == "quantized" for t in tensors)
    report = {"input": src, "format": fmt if quantized else "dense", "shards": shards, "tensors": tensors,
              "dequantize_dtype": restores}
    if isinstance(qc, dict):
        report["quant_method"] = qc.get("quant_method")
        if "config_groups" in qc:
            report["config_groups"] = qc["config_groups"]
    return report
