"""Write the serving-format fixtures with the real libraries (issue 29).

Run in a scratch environment, never in CI (see tests/serving/README.md)::

    python3 -m venv /work/scratch29
    /work/scratch29/bin/pip install torch==2.13.0 compressed-tensors==0.20.0 \
        transformers==5.24.0 safetensors
    /work/scratch29/bin/python tests/serving/make_fixtures.py tests/serving/fixtures

Every folder it writes is a model folder as `save_pretrained` writes it:

* ``base/``: the tiny bfloat16 Llama (2 layers, hidden 128, intermediate 128,
  4 heads of 32, 2 KV heads, vocab 128, untied lm_head) every compressed-tensors
  fixture starts from;
* ``ct-int8-w8a16-channel-sym/``, ``ct-int4-g128-sym/``, ``ct-int4-g128-asym/``,
  ``ct-fp8-channel/``: ``base`` quantized with compressed-tensors' own API
  (``apply_quantization_config`` -> per-module ``calculate_qparams`` on the
  bf16 weight's min/max, as llm-compressor's min-max observer does ->
  ``ModelCompressor.from_pretrained_model(...).compress_model`` ->
  ``save_pretrained`` -> ``update_config``);
* ``padded-base/`` (1 layer, hidden 100, intermediate 70, 2 heads of 50, 1 KV
  head, vocab 128) and ``ct-int4-channel-asym-padded/``,
  ``ct-int8-channel-sym-padded/``: per-channel int4 (asymmetric) and int8
  (symmetric) whose packed rows, and the int4 zero points' packed columns, do
  not fill whole int32 words;
* ``fp8-blocks-base/`` and ``fp8-blocks/``: a second tiny bf16 Llama whose
  Linear shapes are not multiples of 128 (1 layer, hidden 144, intermediate
  200, 2 heads of 72, 1 KV head, vocab 128), and its fine-grained fp8 copy (DeepSeek-V3 / Qwen3-FP8
  layout: ``M.weight`` F8_E4M3 + ``M.weight_scale_inv`` float32
  ``[ceil(out/128), ceil(in/128)]``), whose codes and block scales come from
  compressed-tensors' own block strategy (``calculate_qparams`` +
  ``quantize`` with ``strategy="block"``, ``block_structure=[128, 128]``);
* ``oracle/NAME/dequantized.safetensors``: for each quantized folder, the bf16 weights of
  the quantized Linears as compressed-tensors' own dequantizers give them
  (``CompressedTensorsDequantizer.process`` for the compressed-tensors
  folders, ``FP8BlockDequantizer.process`` for ``fp8-blocks``): the bits gpuq
  must reproduce.

It also writes ``manifest.json`` (library versions, the command, sha256 of
every file, the checks it ran and what they found). The module imports
nothing heavy at import time: pytest's ``--doctest-modules`` imports it.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

SEED = 29

BASE_CONFIG = dict(
    vocab_size=128, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    max_position_embeddings=128, tie_word_embeddings=False,
    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)
PADDED_CONFIG = dict(
    vocab_size=128, hidden_size=100, intermediate_size=70, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, head_dim=50,
    max_position_embeddings=128, tie_word_embeddings=False,
    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)
RAGGED_CONFIG = dict(
    vocab_size=128, hidden_size=144, intermediate_size=200, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, head_dim=72,
    max_position_embeddings=128, tie_word_embeddings=False,
    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)

# name -> (base folder, QuantizationArgs kwargs for the weights, the format
# compressed-tensors should infer)
CT_SCHEMES = {
    "ct-int8-w8a16-channel-sym": (
        "base",
        dict(num_bits=8, type="int", strategy="channel", symmetric=True, dynamic=False),
        "pack-quantized"),
    "ct-int4-g128-sym": (
        "base",
        dict(num_bits=4, type="int", strategy="group", group_size=128, symmetric=True,
             dynamic=False),
        "pack-quantized"),
    "ct-int4-g128-asym": (
        "base",
        dict(num_bits=4, type="int", strategy="group", group_size=128, symmetric=False,
             dynamic=False),
        "pack-quantized"),
    "ct-fp8-channel": (
        "base",
        dict(num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False),
        "naive-quantized"),
    # rows that do not fill whole int32 words (in * bits % 32 != 0), and an
    # asymmetric zero point whose packed column does not either (out * 4 % 32 != 0)
    "ct-int4-channel-asym-padded": (
        "padded-base",
        dict(num_bits=4, type="int", strategy="channel", symmetric=False, dynamic=False),
        "pack-quantized"),
    "ct-int8-channel-sym-padded": (
        "padded-base",
        dict(num_bits=8, type="int", strategy="channel", symmetric=True, dynamic=False),
        "pack-quantized"),
}

FP8_BLOCK_QCONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                     "weight_block_size": [128, 128]}


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _make_model(cfg_kwargs, seed):
    """A tiny bf16 Llama with weights that exercise the schemes: per-row scale
    spread (exp(U(-1, 1))) and a per-row offset (so asymmetric zero points vary)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**cfg_kwargs)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) or isinstance(module, torch.nn.Embedding):
                out, inp = module.weight.shape
                w = torch.randn(out, inp, generator=gen) * 0.02
                w *= torch.exp(torch.rand(out, 1, generator=gen) * 2 - 1)
                w += (torch.rand(out, 1, generator=gen) * 2 - 1) * 0.01
                module.weight.copy_(w.to(torch.bfloat16))
            elif name.endswith("norm"):
                module.weight.copy_((1 + 0.1 * torch.randn(module.weight.shape, generator=gen))
                                    .to(torch.bfloat16))
    return model


def _save_plain(model, out_dir):
    model.save_pretrained(out_dir)
    return out_dir


def _minmax(weight, args):
    """min/max per the strategy, in the weight's own dtype (llm-compressor's
    min-max observer reduces the bf16 weight as it is)."""
    out, inp = weight.shape
    if args.strategy == "channel":
        return weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True)
    if args.strategy == "group":
        g = args.group_size
        w = weight.reshape(out, inp // g, g)
        return w.amin(dim=-1), w.amax(dim=-1)
    if args.strategy == "tensor":
        return weight.amin().reshape(1), weight.amax().reshape(1)
    raise ValueError(args.strategy)


def make_ct_fixture(base_dir, out_dir, name, weight_kwargs, expect_format, notes):
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs, QuantizationConfig, QuantizationScheme, QuantizationStatus,
        apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams, is_module_quantized
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16).eval()
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**weight_kwargs))
    qconfig = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                 quantization_status=QuantizationStatus.FROZEN)
    apply_quantization_config(model, qconfig)
    originals = {}
    for mname, module in model.named_modules():
        if not is_module_quantized(module):
            continue
        args = module.quantization_scheme.weights
        lo, hi = _minmax(module.weight.data, args)
        scale, zp = calculate_qparams(lo, hi, args)
        assert scale.dtype == module.weight_scale.dtype, (scale.dtype, module.weight_scale.dtype)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        module.weight_zero_point.data.copy_(zp.reshape(module.weight_zero_point.shape))
        module.quantization_status = QuantizationStatus.FROZEN
        originals[f"{mname}.weight"] = module.weight.data.clone()
    compressor = ModelCompressor.from_pretrained_model(model)
    fmt = compressor.quantization_config.format
    notes[name] = {"format_inferred": fmt, "base": os.path.basename(base_dir)}
    assert fmt == expect_format, (name, fmt, expect_format)
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(out_dir)
    return originals


def make_fp8_blocks(base_dir, out_dir):
    """Fine-grained fp8 from compressed-tensors' block strategy, stored in the
    DeepSeek-V3 / Qwen3-FP8 layout (weight_scale_inv float32, the multiplier)."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import (
        calculate_qparams, maybe_pad_tensor_for_block_quant)
    from safetensors.torch import load_file, save_file

    args = QuantizationArgs(num_bits=8, type="float", strategy="block",
                            block_structure=[128, 128], symmetric=True, dynamic=False)
    src = os.path.join(base_dir, "model.safetensors")
    tensors = load_file(src)
    out = {}
    for tname, t in tensors.items():
        mname = tname.rpartition(".")[0]
        if (t.ndim == 2 and tname.endswith(".weight") and "embed_tokens" not in tname
                and not mname.endswith("lm_head")):
            w = t.to(torch.float32)
            rows, cols = w.shape
            p = maybe_pad_tensor_for_block_quant(w, (128, 128))
            blocks = p.reshape(p.shape[0] // 128, 128, p.shape[1] // 128, 128)
            lo = blocks.amin(dim=(1, 3))
            hi = blocks.amax(dim=(1, 3))
            scale, zp = calculate_qparams(lo, hi, args)  # float32 [ceil(out/128), ceil(in/128)]
            codes = quantize(x=w, scale=scale, zero_point=None, args=args,
                             dtype=torch.float8_e4m3fn)
            assert codes.shape == (rows, cols) and codes.dtype == torch.float8_e4m3fn
            assert scale.dtype == torch.float32
            assert scale.shape == (-(-rows // 128), -(-cols // 128)), (tname, scale.shape)
            out[tname] = codes.contiguous()
            out[f"{mname}.weight_scale_inv"] = scale.contiguous()
        else:
            out[tname] = t
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(base_dir):
        if f != "model.safetensors":
            shutil.copyfile(os.path.join(base_dir, f), os.path.join(out_dir, f))
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = dict(FP8_BLOCK_QCONFIG)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def write_oracles(root, names, notes):
    """Dequantize each folder with compressed-tensors' own dequantizer; keep the
    quantized Linears' weights (everything else passes through unchanged)."""
    import torch
    from compressed_tensors.entrypoints.convert import (
        CompressedTensorsDequantizer, FP8BlockDequantizer)
    from safetensors.torch import load_file, save_file

    for name in names:
        folder = os.path.join(root, name)
        tensors = load_file(os.path.join(folder, "model.safetensors"))
        if name == "fp8-blocks":
            conv = FP8BlockDequantizer.from_pretrained(folder, dtype=torch.bfloat16)
            keys = {k.rpartition(".")[0] + ".weight" for k in tensors if k.endswith("weight_scale_inv")}
        else:
            conv = CompressedTensorsDequantizer(folder, dtype=torch.bfloat16)
            try:
                conv.process(dict(tensors))
            except KeyError as e:
                # naive-quantized: the model-free matcher takes every `*.weight` of a
                # module not ending in "norm" as quantized under targets ["Linear"]
                # (match_quantizable_tensors), the embedding included.
                notes.setdefault(name, {})["dequantizer_without_extra_ignore"] = f"KeyError {e}"
                conv = CompressedTensorsDequantizer(folder, ignore=["model.embed_tokens"],
                                                    dtype=torch.bfloat16)
                notes[name]["dequantizer_extra_ignore"] = ["model.embed_tokens"]
            keys = {k.rpartition(".")[0] + ".weight" for k in tensors
                    if k.endswith((".weight_packed", ".weight_scale"))}
        deq = conv.process(dict(tensors))
        oracle = {k: deq[k].contiguous() for k in sorted(keys)}
        for v in oracle.values():
            assert v.dtype == torch.bfloat16
        os.makedirs(os.path.join(root, "oracle", name))
        save_file(oracle, os.path.join(root, "oracle", name, "dequantized.safetensors"),
                  # one key: safetensors writes a metadata dict in no fixed order
                  metadata={"made_by": f"compressed_tensors {type(conv).__name__}, bfloat16"})
        notes.setdefault(name, {})["oracle"] = {
            "by": f"compressed_tensors.entrypoints.convert.{type(conv).__name__}.process",
            "tensors": len(oracle)}


def main(argv):
    import compressed_tensors
    import safetensors
    import torch
    import transformers

    root = os.path.abspath(argv[1] if len(argv) > 1 else "tests/serving/fixtures")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    notes = {}
    t0 = time.time()

    _save_plain(_make_model(BASE_CONFIG, SEED), os.path.join(root, "base"))
    _save_plain(_make_model(PADDED_CONFIG, SEED + 2), os.path.join(root, "padded-base"))
    for name, (base, kw, fmt) in CT_SCHEMES.items():
        make_ct_fixture(os.path.join(root, base), os.path.join(root, name), name, kw, fmt, notes)
    ragged = _save_plain(_make_model(RAGGED_CONFIG, SEED + 1), os.path.join(root, "fp8-blocks-base"))
    make_fp8_blocks(ragged, os.path.join(root, "fp8-blocks"))
    notes["fp8-blocks"] = {"base": "fp8-blocks-base"}
    write_oracles(root, list(CT_SCHEMES) + ["fp8-blocks"], notes)

    files = {}
    for dirpath, _, filenames in sorted(os.walk(root)):
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            files[os.path.relpath(p, root)] = {"bytes": os.path.getsize(p), "sha256": _sha256(p)}
    manifest = {
        "made_by": "tests/serving/make_fixtures.py",
        "command": "python tests/serving/make_fixtures.py tests/serving/fixtures",
        "python": sys.version.split()[0],
        "versions": {"torch": torch.__version__, "compressed-tensors": compressed_tensors.__version__,
                     "transformers": transformers.__version__, "safetensors": safetensors.__version__},
        "seconds": round(time.time() - t0, 1),
        "notes": notes,
        "files": files,
    }
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps({k: v for k, v in manifest.items() if k != "files"}, indent=2))


if __name__ == "__main__":
    main(sys.argv)
