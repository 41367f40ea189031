"""gpt-oss's MXFP4 against transformers 5.24 itself (issue 39's acceptance): a tiny
``GptOssConfig`` model (hidden 256, 4 experts, 2 layers, sharded) written by gpuq in MXFP4 loads
in transformers (which dequantizes it on the CPU: it needs ``accelerate``) with the weights and
logits of gpuq's dequantized folder, bit for bit; a folder of random blocks and every scale byte
0..254 in the published layout dequantizes to ``convert_moe_packed_tensors``' bits.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

if sys.version_info < (3, 11):
    pytest.skip("transformers 5.24.0 needs Python >= 3.11 (the test extra installs it only there)",
                allow_module_level=True)
torch = pytest.importorskip("torch", reason="the test extra's torch==2.13.0 is not installed")
pytest.importorskip("transformers", reason="the test extra's transformers==5.24.0 is not installed")
pytest.importorskip("accelerate", reason="transformers loads MXFP4 folders only with accelerate")

from _serving import gpuq_main, load_folder  # noqa: E402

EXPERTS = ("gate_up_proj", "down_proj")


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _torch(a):
    """A bfloat16 NumPy array (ml_dtypes) as a torch tensor, bit for bit."""
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)


def _logits(folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        ids = torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(0))
        return model, model(ids).logits


def _run(*args):
    assert gpuq_main(*args, "--device", "cpu", "-q") == 0


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The bf16 model (saved in shards by transformers), gpuq's MXFP4 folder and its dequantization."""
    import transformers

    root = tmp_path_factory.mktemp("gptoss-tf")
    config = transformers.GptOssConfig(
        hidden_size=256, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False, num_local_experts=4,
        num_experts_per_tok=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(root / "bf16"), max_shard_size="300KB")
    _run("quantize", root / "bf16", "-o", root / "q", "--format", "gpt-oss-mxfp4")
    _run("dequantize", root / "q", "-o", root / "d")
    return root


def test_transformers_loads_gpuqs_mxfp4_as_the_dequantized_folder(folders):
    index = json.loads((folders / "q" / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1 and "model.layers.1.mlp.experts.gate_up_proj_blocks" in index
    model, logits = _logits(folders / "q")
    assert type(model.model.layers[0].mlp.experts).__name__ == "GptOssExperts"  # dequantized on load
    dense_model, dense_logits = _logits(folders / "d")
    state, dense = model.state_dict(), load_folder(folders / "d")
    assert [k for k in dense if not _same(state[k], _torch(dense[k]))] == []
    assert logits.dtype == torch.bfloat16 and _same(logits, dense_logits)
    # the weights gpuq kept (attention, routers, biases, embeddings) are the bf16 model's own
    _, bf16_logits = _logits(folders / "bf16")
    source = load_folder(folders / "bf16")
    assert [k for k in source if not k.endswith(EXPERTS) and not _same(state[k], _torch(source[k]))] == []
    rel = float((logits.float() - bf16_logits.float()).pow(2).mean().sqrt() / bf16_logits.float().pow(2).mean().sqrt())
    assert rel < 0.5, rel  # a wrong transpose, nibble order or scale gives errors of order 1


def test_random_blocks_and_every_scale_dequantize_to_transformers_bits(folders, tmp_path):
    """The published layout filled with random bytes and scale bytes 0..254: gpuq's dense experts
    are ``convert_moe_packed_tensors``' (and the weights transformers loads from that folder)."""
    import shutil

    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from gpuq.checkpoints.files import Checkpoint, write_checkpoint

    shutil.copytree(folders / "q", tmp_path / "r")
    rng = np.random.default_rng(39)
    for shard in sorted((tmp_path / "r").glob("*.safetensors")):
        with Checkpoint(str(shard)) as ckpt:
            t = {n: ckpt.load(n) for n in ckpt.names}
        for n in t:
            if n.endswith("_blocks"):
                t[n] = rng.integers(0, 256, t[n].shape, dtype=np.uint8)
            elif n.endswith("_scales"):
                t[n] = np.resize(rng.permutation(255).astype(np.uint8), t[n].shape)
        write_checkpoint(str(shard), "safetensors", t, None, {"format": "pt"})
    _run("dequantize", tmp_path / "r", "-o", tmp_path / "d", "--nonfinite", "allow")
    q, d = load_folder(tmp_path / "r"), load_folder(tmp_path / "d")
    assert all(np.array_equal(np.unique(q[n]), np.arange(255)) for n in q if n.endswith("_scales"))
    model, _ = _logits(tmp_path / "r")
    state = model.state_dict()
    for i in range(2):
        for p in EXPERTS:
            name = f"model.layers.{i}.mlp.experts.{p}"
            want = convert_moe_packed_tensors(torch.from_numpy(q[name + "_blocks"]), torch.from_numpy(q[name + "_scales"]))
            assert _same(_torch(d[name]), want) and _same(state[name], want)
