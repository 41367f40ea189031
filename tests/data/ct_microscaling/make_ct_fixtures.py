"""Make the compressed-tensors NVFP4 / MX fixtures (issue 39): folders written by compressed-tensors
0.20.0 itself, which ``gpuq dequantize`` must read to its decompressors' bits.

Run offline, never in the tests (it needs torch, compressed-tensors 0.20.0 and transformers
5.24.0, the pinned test extra)::

    .venv/bin/python tests/data/ct_microscaling/make_ct_fixtures.py

Each of ``NVFP4A16/``, ``MXFP4A16/``, ``MXFP6A16/`` and ``MXFP8A16/`` is a tiny bfloat16 Llama (1
layer, hidden 32, 2 heads of 16, 1 KV head, intermediate 32, vocabulary 16, untied lm_head),
quantized the way llm-compressor does it with compressed-tensors' own API:
``apply_quantization_config`` of the preset's scheme (``PRESET_SCHEMES``) -> per module
``calculate_qparams`` of each group's min/max in bfloat16 (llm-compressor's memoryless min-max
observer), NVFP4's global scale ``generate_gparam`` of the merged layer's min/max (q/k/v and
gate/up share it, as llm-compressor links them) -> ``ModelCompressor.from_pretrained_model(...)
.compress_model`` -> ``save_pretrained`` -> ``update_config``. The weights' rows spread over
four octaves (so MX exponents and NVFP4 e4m3 scales vary) and ``up_proj``'s first 32 weights of row
0 are zero (an all-zero group: what scale compressed-tensors stores for it). The tests compare
``gpuq dequantize`` with compressed-tensors' ``CompressedTensorsDequantizer`` at test time, so no
oracle file is committed. Deterministic: two runs give the same bytes. Made with Python 3.11.7,
torch 2.13.0+cpu, compressed-tensors 0.20.0, transformers 5.24.0 (about 40 KiB in all).
"""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = ("NVFP4A16", "MXFP4A16", "MXFP6A16", "MXFP8A16")
CONFIG = dict(vocab_size=16, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, max_position_embeddings=32, tie_word_embeddings=False,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
#: llm-compressor's merged layers, whose NVFP4 global scale is shared.
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def make_model(seed=39):
    """The tiny bfloat16 Llama every fixture starts from."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                w = torch.randn(module.weight.shape, generator=gen) * 0.02
                w *= torch.exp2(torch.rand(w.shape[0], 1, generator=gen) * 4 - 2)
                if name.endswith("up_proj"):
                    w[0, :32] = 0
                module.weight.copy_(w.to(torch.bfloat16))
    return model


def quantize(model, preset, out_dir):
    """``model`` quantized by compressed-tensors with ``preset``'s scheme, saved to ``out_dir``."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationScheme, QuantizationStatus,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils import calculate_qparams, is_module_quantized
    from compressed_tensors.quantization.utils.helpers import generate_gparam

    scheme = QuantizationScheme(targets=["Linear"], **PRESET_SCHEMES[preset])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                                        quantization_status=QuantizationStatus.FROZEN))
    modules = {n: m for n, m in model.named_modules() if is_module_quantized(m)}
    global_scales = {}
    if preset == "NVFP4A16":
        for name in modules:
            parent, _, last = name.rpartition(".")
            parts = next((p for p in FUSED if last in p), (last,))
            ws = [modules[f"{parent}.{p}"].weight.data for p in parts]
            global_scales[name] = generate_gparam(torch.stack([w.min() for w in ws]).min(),
                                                  torch.stack([w.max() for w in ws]).max())
    for name, module in modules.items():
        args = module.quantization_scheme.weights
        w = module.weight.data
        groups = w.reshape(w.shape[0], -1, args.group_size)
        kw = {"global_scale": global_scales[name]} if name in global_scales else {}
        scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args, **kw)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if name in global_scales:
            module.weight_global_scale.data.copy_(global_scales[name].reshape(module.weight_global_scale.shape))
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(out_dir)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(out_dir, extra)):
            os.remove(os.path.join(out_dir, extra))


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else HERE)
    for preset in PRESETS:
        out = os.path.join(root, preset)
        shutil.rmtree(out, ignore_errors=True)
        quantize(make_model(), preset, out)
        print(preset, sorted(os.listdir(out)), sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)))


if __name__ == "__main__":
    main(sys.argv)
