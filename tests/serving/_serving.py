"""Helpers of the serving-format tests: model folders, the CLI, and independent references.

The references here are written from the format descriptions (docs/serving-formats.md), not
from gpuq's code: compressed-tensors' words decoded and encoded with Python integers, one bit
field at a time; the scale and zero-point rule and the codes in plain NumPy float32; bfloat16
rounding by ml_dtypes' cast. Nothing heavy is imported here (pytest's --doctest-modules imports
every module under tests/).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BF16 = np.dtype(ml_dtypes.bfloat16)
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def gpuq_main(*args) -> int:
    from gpuq import cli

    return cli.main([str(a) for a in args])


def one_error_line(capsys) -> str:
    """The stderr of a failed command: exactly one ``gpuq: error: ...`` line."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuq: error: "), err
    return lines[0]


def load(path) -> dict:
    """Every tensor of a .safetensors file (gpuq's reader: no torch needed)."""
    from gpuq.checkpoints.files import Checkpoint

    with Checkpoint(str(path)) as ckpt:
        return {n: ckpt.load(n) for n in ckpt.names}


def load_folder(folder) -> dict:
    """Every tensor of a model folder, across its shards."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            out.update(load(Path(folder) / f))
    return out


def bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.kind in "fV" else a


def same_bits(got, want) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(bits(got), bits(want))


def tree(folder) -> dict:
    """``{file: bytes}`` of a folder (hidden files included): what a failed run must not change."""
    if not os.path.isdir(folder):
        return None
    return {f: Path(folder, f).read_bytes() if Path(folder, f).is_file() else "<folder>"
            for f in sorted(os.listdir(folder))}


def make_model(folder, *, hidden=128, inter=128, heads=4, kv_heads=2, head_dim=32, vocab=128, layers=1,
               dtype="bfloat16", tie=False, seed=0, extra=True):
    """A Llama-shaped model folder (config.json, model.safetensors, generation_config.json and,
    with ``extra``, a tokenizer file, a subfolder and a .bin that must not be copied)."""
    from gpuq.checkpoints.files import write_checkpoint

    rng = np.random.default_rng(seed)
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)

    def w(out, inp):
        x = rng.normal(0, 0.02, (out, inp)) * np.exp(rng.uniform(-1, 1, (out, 1))) + rng.uniform(-0.01, 0.01, (out, 1))
        return x.astype(np.float32).astype(dt)

    t = {"model.embed_tokens.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        outs = {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim}
        for name in PROJ[:3]:
            t[p + f"self_attn.{name}.weight"] = w(outs[name], hidden)
        t[p + "self_attn.o_proj.weight"] = w(hidden, heads * head_dim)
        t[p + "mlp.gate_proj.weight"] = w(inter, hidden)
        t[p + "mlp.up_proj.weight"] = w(inter, hidden)
        t[p + "mlp.down_proj.weight"] = w(hidden, inter)
        for name in ("input_layernorm", "post_attention_layernorm"):
            t[p + f"{name}.weight"] = (1 + 0.1 * rng.normal(size=hidden)).astype(np.float32).astype(dt)
    t["model.norm.weight"] = (1 + 0.1 * rng.normal(size=hidden)).astype(np.float32).astype(dt)
    if not tie:
        t["lm_head.weight"] = w(vocab, hidden)
    os.makedirs(folder, exist_ok=True)
    write_checkpoint(os.path.join(folder, "model.safetensors"), "safetensors", t, None, {"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "num_hidden_layers": layers, "vocab_size": vocab, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": tie, "dtype": dtype, "max_position_embeddings": 128,
              "bos_token_id": 1, "eos_token_id": 2}
    Path(folder, "config.json").write_text(json.dumps(config, indent=2))
    Path(folder, "generation_config.json").write_text('{"bos_token_id": 1}\n')
    if extra:
        Path(folder, "tokenizer.json").write_text('{"model": "tiny"}\n')
        Path(folder, "original").mkdir(exist_ok=True)
        Path(folder, "pytorch_model.bin").write_bytes(b"\x80not a model")
    return t


def reshard(src, dst, shard_of, n):
    """``src`` (a one-file model folder) as ``n`` shards and an index in ``dst``; ``shard_of(name)``
    says where each tensor goes. Every other file is copied."""
    from gpuq.checkpoints.files import write_checkpoint

    t = load(Path(src) / "model.safetensors")
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    os.makedirs(dst, exist_ok=True)
    weight_map = {}
    for i, shard in enumerate(names):
        part = {k: v for k, v in t.items() if shard_of(k) == i}
        write_checkpoint(os.path.join(dst, shard), "safetensors", part, None, {"format": "pt"})
        weight_map.update({k: shard for k in part})
    index = {"metadata": {"total_size": int(sum(v.nbytes for v in t.values()))},
             "weight_map": dict(sorted(weight_map.items()))}
    Path(dst, "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for f in os.listdir(src):
        if f != "model.safetensors" and os.path.isfile(os.path.join(src, f)):
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))


# --- independent references -----------------------------------------------------------------------

def ref_unpack(words, bits_, n) -> np.ndarray:
    """compressed-tensors' words decoded one field at a time with Python integers: the row's
    words as one little-endian integer, field j at bit ``bits * j``, minus the offset."""
    out = np.empty((words.shape[0], n), np.int64)
    mask = (1 << bits_) - 1
    for r, row in enumerate(words.astype(np.int64) & 0xFFFFFFFF):
        value = sum(int(w) << (32 * i) for i, w in enumerate(row))
        out[r] = [((value >> (bits_ * j)) & mask) - (1 << (bits_ - 1)) for j in range(n)]
    return out


def ref_pack(codes, bits_) -> np.ndarray:
    """The inverse of :func:`ref_unpack`: rows padded with zero bits to whole 32-bit words."""
    n = codes.shape[1]
    nwords = -(-n * bits_ // 32)
    out = np.empty((codes.shape[0], nwords), np.int64)
    for r, row in enumerate(codes.astype(np.int64)):
        value = sum((int(q) + (1 << (bits_ - 1))) << (bits_ * j) for j, q in enumerate(row))
        out[r] = [(value >> (32 * i)) & 0xFFFFFFFF for i in range(nwords)]
    return out.astype(np.uint32).view(np.int32)


def ref_params(x, qmin, qmax, divisor, symmetric, group=None, fp8=False):
    """The min/max rule per output row (or per group of ``group`` inputs), float32, each scale
    rounded to bfloat16 by ml_dtypes, the zero point from the rounded scale: ``(s, zp)`` as
    ``[out, groups]``."""
    x = x.astype(np.float32)
    out, n = x.shape
    g = n if group is None else group
    blocks = x.reshape(out, n // g, g)
    lo, hi = blocks.min(axis=2), blocks.max(axis=2)
    if symmetric or fp8:
        s = np.maximum(np.maximum(-lo, hi), np.float32(0)) / np.float32(divisor)
    else:
        lo, hi = np.minimum(lo, np.float32(0)), np.maximum(hi, np.float32(0))
        s = (hi - lo) / np.float32(qmax - qmin)
    s = np.maximum(s, np.float32(np.finfo(np.float32).tiny)).astype(np.float32).astype(BF16).astype(np.float32)
    zp = None if (symmetric or fp8) else np.clip(np.float32(qmin) - np.rint(lo / s), qmin, qmax).astype(np.int64)
    return s, zp


def ref_codes(x, s, zp, qmin, qmax, group=None):
    """``clamp(rint(x / s) + zp, qmin, qmax)`` in float32, per row or group."""
    x = x.astype(np.float32)
    out, n = x.shape
    g = n if group is None else group
    sx = np.repeat(s, g, axis=1)
    q = np.rint(x / sx)
    if zp is not None:
        q = q + np.repeat(zp, g, axis=1)
    return np.clip(q, qmin, qmax).astype(np.int64)


def ref_fp8(x, s_full) -> np.ndarray:
    """fp8 e4m3fn codes of ``x / s`` (float32 quotient, saturated to +-448, ml_dtypes' cast)."""
    return np.clip(x.astype(np.float32) / s_full, -448, 448).astype(np.float32).astype(F8)


def ref_dequant(q, s_full, zp_full=None) -> np.ndarray:
    """bfloat16 of ``float32(q - zp) * s`` (one float32 product, ml_dtypes' rounding)."""
    d = q.astype(np.float32) if zp_full is None else (q.astype(np.int64) - zp_full).astype(np.float32)
    return (d * s_full).astype(np.float32).astype(BF16)
