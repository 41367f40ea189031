"""The tensor table of a Llama checkpoint, shared by the checkpoint benchmarks.

Both ``bench/checkpoint.py`` and ``bench/cli_memory.py`` write Llama-shaped folders with
transformers' tensor names; they differ only in how they choose the widths and the
number of layers.
"""

from __future__ import annotations


def llama_tensors(hidden: int, intermediate: int, vocab: int, layers: int) -> dict:
    """Tensor name -> shape of a Llama checkpoint (transformers' names, file order).

    >>> t = llama_tensors(64, 128, 100, 2)
    >>> len(t), t["model.layers.1.mlp.down_proj.weight"], t["lm_head.weight"]
    (21, (64, 128), (100, 64))
    """
    t = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + f"self_attn.{name}.weight"] = (hidden, hidden)
        t[p + "mlp.gate_proj.weight"] = (intermediate, hidden)
        t[p + "mlp.up_proj.weight"] = (intermediate, hidden)
        t[p + "mlp.down_proj.weight"] = (hidden, intermediate)
        t[p + "input_layernorm.weight"] = (hidden,)
        t[p + "post_attention_layernorm.weight"] = (hidden,)
    t["model.norm.weight"] = (hidden,)
    t["lm_head.weight"] = (vocab, hidden)
    return t
