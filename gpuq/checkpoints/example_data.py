"""A small, deterministic, Llama-shaped checkpoint for trying ``gpuq quantize`` offline.

``gpuq example tiny.safetensors`` writes it: 2 decoder layers, hidden size
256, MLP size 688, vocabulary 1024, bfloat16 by default (as real checkpoints
are), about 2.1 M parameters / 4.0 MiB. Weights are Gaussian (std 0.02) with
a spread of per-row gains and a few outlier input columns, as trained weights
have, so per-channel and per-group scales visibly beat per-tensor ones. The
1-D norm weights and the rotary ``inv_freq`` buffer show what is kept in float.

``gpuq example --model-dir DIR`` writes the same kind of model as a model folder
(``config.json`` + ``model.safetensors``) that transformers loads as a
``LlamaForCausalLM``: 4 attention heads of 64, an MLP of 768 (every Linear
dimension a multiple of 128, as vLLM's kernels want), no ``inv_freq`` (transformers
computes it), 2.5 M parameters.
"""

from __future__ import annotations

import shutil

import numpy as np

HIDDEN, MLP, VOCAB, LAYERS = 256, 688, 1024, 2
#: The model folder's MLP size and attention heads (head_dim 64: the inv_freq above has 32).
MODEL_DIR_MLP, HEADS = 768, 4


def _weight(rng, rows, cols):
    w = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)
    w *= np.exp(rng.normal(0.0, 0.5, size=(rows, 1))).astype(np.float32)  # per-row gains
    outliers = rng.choice(cols, size=max(1, cols // 128), replace=False)
    w[:, outliers] *= np.float32(8.0)  # a few large input channels
    return w


def example_tensors(seed: int = 0, mlp: int = MLP) -> dict:
    """The example's tensors as float32 NumPy arrays, in checkpoint order.

    >>> t = example_tensors()
    >>> t["model.layers.0.mlp.down_proj.weight"].shape, len(t)
    ((256, 688), 22)
    """
    rng = np.random.default_rng(seed)
    t = {"model.embed_tokens.weight": _weight(rng, VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + f"self_attn.{name}.weight"] = _weight(rng, HIDDEN, HIDDEN)
        t[p + "mlp.gate_proj.weight"] = _weight(rng, mlp, HIDDEN)
        t[p + "mlp.up_proj.weight"] = _weight(rng, mlp, HIDDEN)
        t[p + "mlp.down_proj.weight"] = _weight(rng, HIDDEN, mlp)
        for name in ("input_layernorm", "post_attention_layernorm"):
            t[p + f"{name}.weight"] = (1.0 + 0.05 * rng.standard_normal(HIDDEN)).astype(np.float32)
    t["model.norm.weight"] = (1.0 + 0.05 * rng.standard_normal(HIDDEN)).astype(np.float32)
    t["model.rotary_emb.inv_freq"] = (
        1.0 / 10000.0 ** (np.arange(0, 64, 2, dtype=np.float32) / 64)).astype(np.float32)
    t["lm_head.weight"] = _weight(rng, VOCAB, HIDDEN)
    return t


def write_example(path: str, *, dtype: str = "bfloat16", seed: int = 0) -> dict:
    """Write the example checkpoint to ``path`` (.safetensors, .npz or .npy); return its summary.

    ``.npy`` holds one tensor (``model.layers.0.mlp.down_proj.weight``); ``.npz``
    cannot hold bfloat16 (NumPy would store it as raw bytes), so it needs
    ``dtype="float16"`` or ``"float32"``.

    >>> import tempfile, os
    >>> out = os.path.join(tempfile.mkdtemp(), "tiny.npz")
    >>> write_example(out, dtype="float16")["tensors"]
    22
    """
    from .files import CliError, file_format, write_checkpoint

    fmt = file_format(path, "OUT")
    if dtype == "bfloat16":
        if fmt != "safetensors":
            raise CliError(f"--dtype bfloat16 needs a .safetensors OUT ({fmt} cannot hold "
                           f"bfloat16); use --dtype float16 or float32")
        try:
            import ml_dtypes
        except ImportError:
            raise CliError("bfloat16 needs ml_dtypes: pip install 'gpuq[cli]'") from None
        target = np.dtype(ml_dtypes.bfloat16)
    else:
        target = np.dtype(dtype)
    tensors = example_tensors(seed)
    if fmt == "npy":
        tensors = {"arr_0": tensors["model.layers.0.mlp.down_proj.weight"]}
    # astype rounds to nearest even, as a framework's .to(bfloat16) does.
    tensors = {k: v.astype(target) for k, v in tensors.items()}
    write_checkpoint(path, fmt, tensors, None, {"format": "pt"} if fmt == "safetensors" else None)
    return {"path": path, "tensors": len(tensors), "dtype": target.name,
            "parameters": int(sum(v.size for v in tensors.values())),
            "bytes": int(sum(v.nbytes for v in tensors.values()))}


def model_config(dtype: str) -> dict:
    """The model folder's ``config.json``: what transformers 5 writes for this LlamaForCausalLM.

    >>> model_config("bfloat16")["intermediate_size"]
    768
    """
    return {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 1, "dtype": dtype, "eos_token_id": 2, "head_dim": HIDDEN // HEADS,
            "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02,
            "intermediate_size": MODEL_DIR_MLP, "max_position_embeddings": 2048, "mlp_bias": False,
            "model_type": "llama", "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
            "num_key_value_heads": HEADS, "pretraining_tp": 1, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False, "use_cache": True, "vocab_size": VOCAB}


def write_model_dir(path: str, *, dtype: str = "bfloat16", seed: int = 0) -> dict:
    """Write the example as a model folder at ``path`` (new, or an empty folder); return its summary.

    ``model.safetensors`` first, ``config.json`` last, each atomically; a failure leaves no
    folder behind that this call created.

    >>> import tempfile, os
    >>> write_model_dir(os.path.join(tempfile.mkdtemp(), "tiny"), dtype="float32")["tensors"]
    21
    """
    import os

    from .files import CliError, _one_line, write_checkpoint
    from .serving.folder import CONFIG, SINGLE, write_json

    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise CliError(f"--model-dir {path!r} exists and is not an empty folder: the example goes to a "
                       f"new folder")
    created = not os.path.exists(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot write --model-dir {path!r}: {_one_line(exc)}") from exc
    target = _float_dtype(dtype)
    tensors = {k: v.astype(target) for k, v in example_tensors(seed, MODEL_DIR_MLP).items()
               if not k.endswith("inv_freq")}  # a buffer transformers computes, not a weight
    try:
        write_checkpoint(os.path.join(path, SINGLE), "safetensors", tensors, None, {"format": "pt"})
        write_json(os.path.join(path, CONFIG), model_config(target.name))
    except BaseException:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        raise
    return {"path": path, "tensors": len(tensors), "dtype": target.name,
            "parameters": int(sum(v.size for v in tensors.values())),
            "bytes": int(sum(v.nbytes for v in tensors.values()))}


def _float_dtype(dtype: str) -> np.dtype:
    from .convert import float_dtype
    from .files import CliError

    try:
        return float_dtype(dtype)
    except ImportError:
        raise CliError("bfloat16 needs ml_dtypes: pip install 'gpuq[cli]'") from None
