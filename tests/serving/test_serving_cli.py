"""gpuq quantize --format compressed-tensors | fp8-blocks and gpuq dequantize of model folders.

No torch here: what gpuq writes is compared with independent references (_serving.py: the
words decoded with Python integers, the scale rule and the codes in NumPy float32, bfloat16 by
ml_dtypes); what compressed-tensors wrote (tests/serving/fixtures, made by make_fixtures.py with
the real library) is dequantized by gpuq to the bits of its own dequantizers (the committed
oracles). test_serving_libraries.py runs the libraries themselves.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from _serving import (BF16, FIXTURES, MLP, PROJ, bits, gpuq_main, load, load_folder, make_model, one_error_line,
                      ref_codes, ref_dequant, ref_fp8, ref_pack, ref_params, ref_unpack, reshard, same_bits,
                      tree)
from gpuq.checkpoints.serving.packing import pack_rows, unpack_rows

CT_FIXTURES = ["ct-int8-w8a16-channel-sym", "ct-int4-g128-sym", "ct-int4-g128-asym", "ct-fp8-channel",
               "ct-int4-channel-asym-padded", "ct-int8-channel-sym-padded", "fp8-blocks"]
LINEARS = [f"model.layers.0.self_attn.{p}" for p in PROJ] + [f"model.layers.0.mlp.{p}" for p in MLP]


def _quantize(src, out, *options, capsys=None):
    assert gpuq_main("quantize", src, "-o", out, "--device", "cpu", "-q", "--json", *options) == 0
    return json.loads(capsys.readouterr().out) if capsys else None


def _config(folder) -> dict:
    return json.loads(Path(folder, "config.json").read_text())


# --- the packing, against the real library's words and a bit-by-bit decoder ------------------------

@pytest.mark.parametrize("bits_", [4, 8])
@pytest.mark.parametrize("n", [1, 7, 8, 70, 100, 128])
def test_packing_against_a_bit_by_bit_statement(bits_, n):
    rng = np.random.default_rng(n * bits_)
    q = rng.integers(-(1 << (bits_ - 1)), 1 << (bits_ - 1), (5, n)).astype(np.int8)
    q[:2, 0] = (-(1 << (bits_ - 1)), (1 << (bits_ - 1)) - 1)  # both ends of the range
    words = pack_rows(q, bits_)
    same_bits(words, ref_pack(q, bits_))
    np.testing.assert_array_equal(ref_unpack(words, bits_, n), q)
    np.testing.assert_array_equal(unpack_rows(words, bits_, n), q)


def test_unpacking_refuses_padding_bits_and_wrong_widths():
    words = pack_rows(np.zeros((2, 6), np.int8), 4)  # 6 nibbles of 8: the top two are padding
    words[1, 0] |= np.int32(1 << 28)
    with pytest.raises(ValueError, match="row 1 has padding bits that are not 0 after its 6 codes"):
        unpack_rows(words, 4, 6)
    with pytest.raises(ValueError, match="10 codes of 4 bits take 2 words a row, got 1"):
        unpack_rows(words, 4, 10)
    with pytest.raises(ValueError, match="bits must divide 32"):
        pack_rows(np.zeros((1, 4), np.int8), 3)


@pytest.mark.parametrize("name", [n for n in CT_FIXTURES if n.startswith("ct-") and "fp8" not in n])
def test_packing_reproduces_the_words_compressed_tensors_wrote(name):
    """Every weight_packed / weight_zero_point of the fixtures: unpacked by gpuq as the bit-by-bit
    decoder reads them, and packed again to the same words (padding included)."""
    t = load(FIXTURES / name / "model.safetensors")
    cfg = _config(FIXTURES / name)["quantization_config"]["config_groups"]["group_0"]["weights"]
    seen = 0
    for key, words in t.items():
        if key.endswith(".weight_packed"):
            n = int(t[key.replace("weight_packed", "weight_shape")][1])
        elif key.endswith(".weight_zero_point"):
            words = np.ascontiguousarray(words.T)
            n = int(t[key.replace("weight_zero_point", "weight_shape")][0])
        else:
            continue
        q = unpack_rows(words, cfg["num_bits"], n)
        np.testing.assert_array_equal(q, ref_unpack(words, cfg["num_bits"], n))
        same_bits(pack_rows(q, cfg["num_bits"]), words)
        seen += 1
    assert seen >= 7


# --- written by compressed-tensors, read by gpuq ---------------------------------------------------

@pytest.mark.parametrize("name", CT_FIXTURES)
def test_fixtures_dequantize_to_their_dequantizers_bits(tmp_path, capsys, name):
    """gpuq dequantize of a folder compressed-tensors wrote (fp8-blocks: written from its block
    strategy) = CompressedTensorsDequantizer.process / FP8BlockDequantizer.process, bit for bit."""
    out = tmp_path / "dense"
    assert gpuq_main("dequantize", FIXTURES / name, "-o", out, "--device", "cpu", "-q", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    oracle = load(FIXTURES / "oracle" / name / "dequantized.safetensors")
    dense = load(out / "model.safetensors")
    for key, want in oracle.items():
        same_bits(dense[key], want)
    assert report["total"]["quantized"] == len(oracle)
    # Everything else is the input's, bit for bit; no quantization parameter is left.
    src = load(FIXTURES / name / "model.safetensors")
    assert set(dense) == {k for k in src if not re.search(r"\.weight_(packed|scale|scale_inv|shape|zero_point)$", k)} \
        | set(oracle)
    for key in dense.keys() - oracle.keys():
        same_bits(dense[key], src[key])
    cfg = _config(out)
    assert "quantization_config" not in cfg and cfg["dtype"] == "bfloat16"
    assert (out / "generation_config.json").read_bytes() == (FIXTURES / name / "generation_config.json").read_bytes()


def test_fine_grained_fp8_fixture_is_the_block_formula(tmp_path):
    """The ragged fixture (144 x 200 weights, 128 x 128 blocks) against the formula stated here:
    each code as float32 times its own block's weight_scale_inv, rounded once to bfloat16."""
    assert gpuq_main("dequantize", FIXTURES / "fp8-blocks", "-o", tmp_path / "d", "--device", "cpu", "-q") == 0
    src, dense = load(FIXTURES / "fp8-blocks" / "model.safetensors"), load(tmp_path / "d" / "model.safetensors")
    ragged = 0
    for key in (k for k in src if k.endswith(".weight_scale_inv")):
        w = key.replace("_scale_inv", "")
        codes, s = src[w], src[key]
        rows = np.repeat(np.arange(s.shape[0]), 128)[:codes.shape[0]]
        cols = np.repeat(np.arange(s.shape[1]), 128)[:codes.shape[1]]
        want = (codes.astype(np.float32) * s[rows][:, cols]).astype(BF16)
        same_bits(dense[w], want)
        ragged += codes.shape[0] % 128 != 0 or codes.shape[1] % 128 != 0
    assert ragged == 7  # every Linear of the fixture has a ragged edge


def test_a_scale_in_another_shard_is_found_through_the_index(tmp_path, capsys):
    """compressed-tensors' int4 asym fixture as two shards, every weight_scale and zero point
    in the other shard than its codes (SkyRL#2024's case): the same bits, sharded out."""
    reshard(FIXTURES / "ct-int4-g128-asym", tmp_path / "in",
            lambda k: int(k.endswith((".weight_scale", ".weight_zero_point")) != ("layers.1" in k)), 2)
    assert gpuq_main("dequantize", tmp_path / "in", "-o", tmp_path / "out", "--device", "cpu", "-q") == 0
    oracle = load(FIXTURES / "oracle" / "ct-int4-g128-asym" / "dequantized.safetensors")
    dense = load_folder(tmp_path / "out")
    for key, want in oracle.items():
        same_bits(dense[key], want)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(dense)
    src_index = json.loads((tmp_path / "in" / "model.safetensors.index.json").read_text())["weight_map"]
    for key in oracle:  # a dense weight stays in the shard that held its codes
        assert index["weight_map"][key] == src_index[key.replace(".weight", ".weight_packed")]
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in dense.values())


def test_a_shard_of_only_scales_leaves_no_empty_shard(tmp_path, capsys):
    """Every weight_scale and zero point in a third shard: the dense folder has two shards, both
    in its index, and no empty file beside them."""
    reshard(FIXTURES / "ct-int4-g128-asym", tmp_path / "in",
            lambda k: 2 if k.endswith((".weight_scale", ".weight_zero_point")) else int("layers.1" in k), 3)
    assert gpuq_main("dequantize", tmp_path / "in", "-o", tmp_path / "out", "--device", "cpu", "-q") == 0
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    shards = sorted(f for f in os.listdir(tmp_path / "out") if f.endswith(".safetensors"))
    assert shards == sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"]
    oracle = load(FIXTURES / "oracle" / "ct-int4-g128-asym" / "dequantized.safetensors")
    dense = load_folder(tmp_path / "out")
    for key, want in oracle.items():
        same_bits(dense[key], want)


# --- written by gpuq: what it stores, against the references --------------------------------------

@pytest.mark.parametrize("options,bits_,group,divisor", [  # divisor None: asymmetric
    ((), 8, None, 127),                                        # W8A16 per channel, the default (narrow)
    (("--dtype", "int4"), 4, 128, 7.5),                         # int4 g128, the int4 default: full range
    (("--dtype", "int4", "--scale-rule", "narrow"), 4, 128, 7),  # the narrow rule on request
    (("--dtype", "int8", "--scale-rule", "full"), 8, None, 127.5),
    (("--dtype", "int4", "--asymmetric"), 4, 128, None),
    (("--dtype", "int4", "--asymmetric", "--axis", "0"), 4, None, None),
    (("--dtype", "int8", "--group-size", "64", "--asymmetric"), 8, 64, None),
])
def test_pack_quantized_tensors_against_the_reference(tmp_path, capsys, options, bits_, group, divisor):
    symmetric = divisor is not None
    src = make_model(tmp_path / "m", hidden=128, inter=256, seed=bits_)
    report = _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", *options, capsys=capsys)
    full = divisor in (7.5, 127.5)
    assert report["scale_rule"] == ("full" if full else "narrow" if symmetric else None)
    assert all(r["scheme"]["scale_rule"] == report["scale_rule"] for r in report["tensors"] if r["quantized"])
    assert all(("full-range" in r["scheme_text"]) == full for r in report["tensors"] if r["quantized"])
    t = load(tmp_path / "q" / "model.safetensors")
    qmin, qmax = -(1 << (bits_ - 1)), (1 << (bits_ - 1)) - 1
    for m in LINEARS:
        x = src[m + ".weight"]
        s, zp = ref_params(x, qmin, qmax, divisor, symmetric, group)
        q = ref_codes(x, s, zp, qmin, qmax, group)
        same_bits(t[m + ".weight_scale"], s.astype(BF16))
        same_bits(t[m + ".weight_packed"], ref_pack(q, bits_))
        same_bits(t[m + ".weight_shape"], np.array(x.shape, np.int64))
        if symmetric:
            assert m + ".weight_zero_point" not in t
        else:
            same_bits(t[m + ".weight_zero_point"], np.ascontiguousarray(ref_pack(zp.T, bits_).T))
        # gpuq dequantize of what it wrote: the same formula, bfloat16 out
    assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--device", "cpu", "-q") == 0
    dense = load(tmp_path / "d" / "model.safetensors")
    for m in LINEARS:
        x = src[m + ".weight"]
        s, zp = ref_params(x, qmin, qmax, divisor, symmetric, group)
        g = x.shape[1] if group is None else group
        same_bits(dense[m + ".weight"], ref_dequant(ref_codes(x, s, zp, qmin, qmax, group), np.repeat(s, g, 1),
                                                    None if zp is None else np.repeat(zp, g, 1)))
    # the SQNR reported is that of the stored weights (scales in bfloat16), dequantized in float32
    m = LINEARS[0]
    row = next(r for r in report["tensors"] if r["name"] == m + ".weight")
    x = src[m + ".weight"].astype(np.float64)
    s, zp = ref_params(src[m + ".weight"], qmin, qmax, divisor, symmetric, group)
    g = x.shape[1] if group is None else group
    q = ref_codes(src[m + ".weight"], s, zp, qmin, qmax, group)
    d = (q - (0 if zp is None else np.repeat(zp, g, 1))).astype(np.float32) * np.repeat(s, g, 1)
    assert abs(row["sqnr_db"] - 10 * np.log10((x * x).sum() / ((x - d) ** 2).sum())) < 1e-9


def test_calibrate_mse_is_the_library_call_with_the_model_dtype(tmp_path, capsys):
    """--calibrate mse: the stored scales are choose_qparams(method="mse", scale_dtype=the model's)
    and the codes are those scales'; the table says how the scales were chosen."""
    import gpuq

    src = make_model(tmp_path / "m", seed=5)
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors",
                     "--dtype", "int4", "--calibrate", "mse", "--device", "cpu", "-q") == 0
    assert "note: scales by the MSE search (--calibrate mse)" in capsys.readouterr().out
    t = load(tmp_path / "q" / "model.safetensors")
    for m in LINEARS:
        x = src[m + ".weight"]
        s, _ = gpuq.choose_qparams(x, axis=1, group_size=128, dtype="int4", symmetric=True, method="mse",
                                   scale_dtype="bfloat16", scale_rule="full")
        same_bits(t[m + ".weight_scale"], s.astype(BF16))
        same_bits(t[m + ".weight_packed"], ref_pack(ref_codes(x, s, None, -8, 7, 128), 4))
    minmax = ref_params(src[LINEARS[0] + ".weight"], -8, 7, 7.5, True, 128)[0]
    assert (t[LINEARS[0] + ".weight_scale"].astype(np.float32) != minmax).any()  # the search moved them


@pytest.mark.parametrize("per_tensor", [False, True])
def test_fp8_naive_tensors_against_the_reference(tmp_path, capsys, per_tensor):
    src = make_model(tmp_path / "m", seed=3)
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", "--dtype", "float8_e4m3fn",
              *(["--per-tensor"] if per_tensor else []), capsys=capsys)
    t = load(tmp_path / "q" / "model.safetensors")
    for m in LINEARS:
        x = src[m + ".weight"]
        if per_tensor:
            s = ref_params(x.reshape(1, -1), -448, 448, 448, True, fp8=True)[0]
            same_bits(t[m + ".weight_scale"], s.reshape(1).astype(BF16))
        else:
            s = ref_params(x, -448, 448, 448, True, fp8=True)[0]
            same_bits(t[m + ".weight_scale"], s.astype(BF16))
        same_bits(t[m + ".weight"], ref_fp8(x, s if not per_tensor else s.reshape(1, 1)))
    cfg = _config(tmp_path / "q")["quantization_config"]
    assert cfg["format"] == "naive-quantized"
    assert cfg["config_groups"]["group_0"]["weights"] == {
        "dynamic": False, "group_size": None, "num_bits": 8, "strategy": "tensor" if per_tensor else "channel",
        "symmetric": True, "type": "float"}


def test_fp8_blocks_tensors_against_the_reference(tmp_path, capsys):
    """Ragged 128 x 128 blocks: the float32 scale max|x| / 448 of each block's real elements."""
    src = make_model(tmp_path / "m", hidden=144, inter=200, heads=2, kv_heads=1, head_dim=72, seed=4)
    report = _quantize(tmp_path / "m", tmp_path / "q", "--format", "fp8-blocks", capsys=capsys)
    t = load(tmp_path / "q" / "model.safetensors")
    for m in LINEARS:
        x = src[m + ".weight"].astype(np.float32)
        out, n = x.shape
        s = np.empty((-(-out // 128), -(-n // 128)), np.float32)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = np.float32(np.abs(x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]).max()) / np.float32(448)
        same_bits(t[m + ".weight_scale_inv"], s)
        full = s[np.arange(out) // 128][:, np.arange(n) // 128]
        same_bits(t[m + ".weight"], ref_fp8(x, full))
        # the SQNR reported is that of these codes and scales, dequantized in float32
        row = next(r for r in report["tensors"] if r["name"] == m + ".weight")
        d = ref_fp8(x, full).astype(np.float32) * full
        x64 = x.astype(np.float64)
        assert abs(row["sqnr_db"] - 10 * np.log10((x64 * x64).sum() / ((x64 - d) ** 2).sum())) < 1e-9
    assert _config(tmp_path / "q")["quantization_config"] == {
        "activation_scheme": "dynamic", "fmt": "e4m3", "ignored_layers": [
            "lm_head", "model.embed_tokens", "model.layers.0.input_layernorm",
            "model.layers.0.post_attention_layernorm", "model.norm"],
        "quant_method": "fp8", "weight_block_size": [128, 128]}
    vllm = {r["name"].rsplit(".", 2)[1]: r["vllm"] for r in report["tensors"] if r["quantized"]}
    assert vllm["q_proj"] == "no: merged into qkv_proj, out 144 % 128"
    assert vllm["k_proj"] == "no: merged into qkv_proj, out 72 % 128"
    assert vllm["v_proj"] == vllm["up_proj"] == vllm["o_proj"] == "ok"
    assert vllm["gate_proj"] == "no: merged into gate_up_proj, out 200 % 128"


# --- the ignore rule, the selection, the vLLM column ------------------------------------------------

def test_ignore_lists_every_module_kept_in_float(tmp_path, capsys):
    make_model(tmp_path / "m", layers=2)
    report = _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", capsys=capsys)
    qc = _config(tmp_path / "q")["quantization_config"]
    assert qc["ignore"] == ["lm_head", "model.embed_tokens", "model.layers.0.input_layernorm",
                            "model.layers.0.post_attention_layernorm", "model.layers.1.input_layernorm",
                            "model.layers.1.post_attention_layernorm", "model.norm"]
    assert qc["config_groups"]["group_0"]["targets"] == ["Linear"]
    t = load(tmp_path / "q" / "model.safetensors")
    quantized = {k.rsplit(".", 1)[0] for k in t if k.endswith(".weight_packed")}
    floats = {k.rsplit(".", 1)[0] for k in t if k.endswith(".weight")}
    assert quantized.isdisjoint(qc["ignore"]) and floats == set(qc["ignore"])
    assert len(quantized) == 14 and report["total"]["quantized"] == 14


def test_tied_lm_head_is_ignored(tmp_path, capsys):
    make_model(tmp_path / "m", tie=True)
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", capsys=capsys)
    assert "lm_head" in _config(tmp_path / "q")["quantization_config"]["ignore"]


def test_lm_head_is_quantized_when_include_names_it(tmp_path, capsys):
    make_model(tmp_path / "m")
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", "--include", "lm_head.weight",
              "--include", "model.layers.*", capsys=capsys)
    t = load(tmp_path / "q" / "model.safetensors")
    assert "lm_head.weight_packed" in t and "lm_head" not in _config(tmp_path / "q")["quantization_config"]["ignore"]


def test_merged_layers_are_kept_whole_and_undivided_groups_in_float(tmp_path, capsys):
    """--exclude k_proj keeps q/k/v in float (vLLM merges them); group 64 does not divide
    down_proj's 96 inputs, which stays in float; every such module is in ignore and the notes."""
    make_model(tmp_path / "m", inter=96)
    report = _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", "--dtype", "int4",
                       "--group-size", "64", "--exclude", "*k_proj*", capsys=capsys)
    ignore = _config(tmp_path / "q")["quantization_config"]["ignore"]
    for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj"):
        assert f"model.layers.0.{p}" in ignore
    t = load(tmp_path / "q" / "model.safetensors")
    assert sorted(k for k in t if k.endswith("weight_packed")) == [
        f"model.layers.0.{p}.weight_packed" for p in ("mlp.gate_proj", "mlp.up_proj", "self_attn.o_proj")]
    notes = "\n".join(report["notes"])
    assert "model.layers.0.mlp.down_proj (group size 64 does not divide its input dimension 96" in notes
    assert ("model.layers.0.self_attn.q_proj (kept with model.layers.0.self_attn.k_proj: vLLM merges "
            "q_proj/k_proj/v_proj into one layer") in notes


ROUTERS = ["model.layers.0.mlp.gate", "model.layers.0.block_sparse_moe.gate", "model.layers.0.mlp.router",
           "model.layers.0.mlp.shared_expert_gate"]


@pytest.mark.parametrize("options", [("--format", "compressed-tensors"), ("--format", "compressed-tensors",
                                      "--dtype", "int4"), ("--format", "fp8-blocks")])
def test_moe_routers_stay_in_float(tmp_path, capsys, options):
    """The routers of Qwen3-MoE (mlp.gate), Mixtral (block_sparse_moe.gate), gpt-oss (mlp.router)
    and Qwen2-MoE (shared_expert_gate), 128 experts (a shape Marlin takes), even where --include
    names them: stored as they are, in ignore / ignored_layers, 'MoE router' with '-' for vLLM."""
    from gpuq.checkpoints.files import write_checkpoint

    t = make_model(tmp_path / "m")
    rng = np.random.default_rng(1)
    routers = {m + ".weight": rng.normal(0, 0.02, (1 if "shared" in m else 128, 128)).astype(BF16) for m in ROUTERS}
    write_checkpoint(str(tmp_path / "m" / "model.safetensors"), "safetensors", {**t, **routers}, None)
    report = _quantize(tmp_path / "m", tmp_path / "q", *options, "--include", "model.layers.*", capsys=capsys)
    out = load(tmp_path / "q" / "model.safetensors")
    for name, w in routers.items():
        same_bits(out[name], w)
    qc = _config(tmp_path / "q")["quantization_config"]
    assert set(ROUTERS) <= set(qc["ignored_layers" if "fp8-blocks" in options else "ignore"])
    rows = {r["name"]: r for r in report["tensors"]}
    assert all(rows[n]["reason"] == "MoE router" and rows[n]["vllm"] == "-" and not rows[n]["quantized"]
               for n in routers)
    assert rows["model.layers.0.mlp.gate_proj.weight"]["quantized"]  # gate_proj is no router
    assert any(n.startswith("note: 4 MoE routers kept in float") for n in report["notes"])
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q2", "--device", "cpu", *options) == 0
    table = capsys.readouterr().out
    assert re.search(r"\nmodel\.layers\.0\.mlp\.gate\.weight +128x128 +MoE router +32\.0 KiB +32\.0 KiB +-\n",
                     table), table


def test_vllm_column(tmp_path, capsys):
    make_model(tmp_path / "m", hidden=100, inter=128, heads=2, kv_heads=1, head_dim=50)
    report = _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", "--asymmetric",
                       capsys=capsys)
    vllm = {r["name"].rsplit(".", 2)[1]: r["vllm"] for r in report["tensors"] if r["quantized"]}
    assert vllm["q_proj"] == ("no: out 100 % 64; in 100 % 128; asymmetric int8: Marlin's zero points are "
                              "4-bit only")
    assert vllm["up_proj"] == "no: in 100 % 128; asymmetric int8: Marlin's zero points are 4-bit only"
    report = _quantize(tmp_path / "m", tmp_path / "q2", "--format", "compressed-tensors", "--dtype", "int4",
                       "--group-size", "32", capsys=capsys)
    vllm = {r["name"].rsplit(".", 2)[1]: r["vllm"] for r in report["tensors"] if r["quantized"]}
    assert vllm == {"down_proj": "no: out 100 % 64"}  # the others: 32 does not divide their 100 inputs


@pytest.mark.parametrize("preset", ["NVFP4A16", "MXFP4A16", "MXFP4", "MXFP6A16", "MXFP8A16"])
def test_vllm_column_fp4(tmp_path, capsys, preset):
    """fp4 Marlin (NVFP4A16, MXFP4A16): out padded to 64; in % 128, or in % 64 with the padded
    out % 128. q_proj and o_proj [192, 192] fail both; k/v [96 -> 128, 192] and gate/up [128, 192] pass by
    the second; down [192, 128] by the first. MXFP4 (fp4 activations), fp6 and MX fp8: '-'."""
    make_model(tmp_path / "m", hidden=192, inter=128, heads=2, kv_heads=1, head_dim=96, vocab=64, extra=False)
    report = _quantize(tmp_path / "m", tmp_path / "q", "--preset", preset, capsys=capsys)
    vllm = {r["name"].rsplit(".", 2)[1]: r["vllm"] for r in report["tensors"] if r["quantized"]}
    assert len(vllm) == 7
    note = [n for n in report["notes"] if n.startswith("note: vLLM column")]
    if preset not in ("NVFP4A16", "MXFP4A16"):
        assert set(vllm.values()) == {"-"} and note == []
        return
    for m in ("q_proj", "o_proj"):
        assert vllm.pop(m) == "no: in 192 % 128 (or in % 64 with out 192, padded to 192, % 128)"
    assert set(vllm.values()) == {"Marlin ok"}
    assert note == ["note: vLLM column: fp4 Marlin's shape rules (out padded to 64; in % 128, or in % 64 with "
                    "the padded out % 128; groups of 16 with e4m3 scales, 32 with e8m0); '-' where no rule is "
                    "checked"]


def _transformers_note(report):
    found = [n for n in report["notes"] if n.startswith("note: transformers 5.24 does not load this folder")]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize("options,note", [
    (("--format", "compressed-tensors"), None),
    (("--format", "compressed-tensors", "--dtype", "int4"), None),
    (("--format", "compressed-tensors", "--dtype", "float8_e4m3fn"), None),
    (("--format", "compressed-tensors", "--asymmetric"), "llm-compressor#1618"),
    (("--format", "compressed-tensors", "--dtype", "int4", "--asymmetric"), "llm-compressor#1618"),
    (("--format", "fp8-blocks"), None),  # 128x128 blocks: every dimension a multiple of 128
])
def test_the_report_says_when_transformers_will_not_load_it(tmp_path, capsys, options, note):
    make_model(tmp_path / "m")
    got = _transformers_note(_quantize(tmp_path / "m", tmp_path / "q", *options, capsys=capsys))
    assert (got is None) if note is None else (note in got and "vLLM" in got and "gpuq dequantize" in got), got


def test_the_report_says_ragged_fp8_blocks_do_not_load_right(tmp_path, capsys):
    """A dimension over 128 and no multiple of it (144, 200, 257) is a ragged edge block, which
    transformers 5.24 dequantizes with a block of dimension // grid: wrong weights, or a refusal
    where that does not divide (257 // 3); 72 (one block) and 128 are right."""
    make_model(tmp_path / "m", hidden=144, inter=257, heads=2, kv_heads=1, head_dim=72)
    got = _transformers_note(_quantize(tmp_path / "m", tmp_path / "q", "--format", "fp8-blocks", capsys=capsys))
    # q/o 144x144, k/v 72x144, gate/up 257x144 (refused), down 144x257 (refused)
    assert got == ("note: transformers 5.24 does not load this folder right: 7 weights have ragged edge blocks "
                   "(a dimension over 128 that is no multiple of it: model.layers.0.mlp.down_proj 144x257, ...), "
                   "whose block it takes as rows // scale rows x cols // scale cols when it dequantizes on load "
                   "(as it does without a GPU): it loads 4 with wrong weights and refuses 3 (not divisible by "
                   "scale grid: the load stops); vLLM and gpuq dequantize read it right"), got


def test_the_table_shows_the_column_and_the_notes(tmp_path, capsys):
    make_model(tmp_path / "m")
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors",
                     "--device", "cpu", "-q") == 0
    out = capsys.readouterr().out
    assert "(compressed-tensors, device: cpu)" in out.splitlines()[0]
    assert re.search(r"model\.layers\.0\.mlp\.down_proj\.weight +128x128 +int8 sym channel .* Marlin ok", out)
    assert ("note: kept in float and listed in ignore: lm_head (the output layer, kept by default: an --include "
            "naming it quantizes it)") in out
    assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--device", "cpu", "-q") == 0
    assert capsys.readouterr().out.startswith(
        f"gpuq dequantize: {tmp_path / 'q'} -> {tmp_path / 'd'} (compressed-tensors pack-quantized, device: cpu): "
        f"restored 7, kept 5,")
    assert "note: not copied into OUT: original/, pytorch_model.bin" in out


# --- model folders: other files, shards, all or nothing ---------------------------------------------

def test_other_files_are_copied_and_weights_of_other_formats_are_not(tmp_path, capsys):
    make_model(tmp_path / "m")
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", capsys=capsys)
    assert sorted(os.listdir(tmp_path / "q")) == ["config.json", "generation_config.json", "model.safetensors",
                                                  "tokenizer.json"]
    for f in ("generation_config.json", "tokenizer.json"):
        assert (tmp_path / "q" / f).read_bytes() == (tmp_path / "m" / f).read_bytes()
    cfg, src_cfg = _config(tmp_path / "q"), _config(tmp_path / "m")
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src_cfg


def test_inputs_are_not_modified(tmp_path):
    make_model(tmp_path / "m")
    before = tree(tmp_path / "m")
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", "--dtype", "int4", "--asymmetric")
    assert tree(tmp_path / "m") == before
    quantized = tree(tmp_path / "q")
    assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--device", "cpu", "-q") == 0
    assert tree(tmp_path / "q") == quantized


def test_sharded_model_folder_round_trip(tmp_path, capsys):
    """A sharded model quantized shard by shard (each quantized weight's tensors in its shard), the
    index complete; dequantized back: the bits of the one-file run."""
    make_model(tmp_path / "one", layers=2)
    reshard(tmp_path / "one", tmp_path / "m", lambda k: int("layers.1" in k or k.startswith("lm_head")), 2)
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", "--dtype", "int4", "--asymmetric")
    _quantize(tmp_path / "one", tmp_path / "q1", "--format", "compressed-tensors", "--dtype", "int4", "--asymmetric")
    index = json.loads((tmp_path / "q" / "model.safetensors.index.json").read_text())
    files = {f: load(tmp_path / "q" / f) for f in sorted(set(index["weight_map"].values()))}
    assert {k: f for f, t in files.items() for k in t} == index["weight_map"]
    for key, shard in index["weight_map"].items():
        assert shard.startswith("model-00002") == ("layers.1" in key or key.startswith("lm_head"))
    one = load(tmp_path / "q1" / "model.safetensors")
    for t in files.values():
        for k, v in t.items():
            same_bits(v, one[k])
    assert _config(tmp_path / "q") == _config(tmp_path / "q1")
    assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--device", "cpu", "-q") == 0
    assert gpuq_main("dequantize", tmp_path / "q1", "-o", tmp_path / "d1", "--device", "cpu", "-q") == 0
    a, b = load_folder(tmp_path / "d"), load(tmp_path / "d1" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        same_bits(a[k], b[k])


def test_gpuq_own_files_in_a_model_folder(tmp_path, capsys):
    """A model folder whose shards gpuq's own format wrote (and a config.json beside them)."""
    make_model(tmp_path / "one", layers=2, extra=False)
    reshard(tmp_path / "one", tmp_path / "m", lambda k: int("layers.1" in k), 2)
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--device", "cpu", "-q") == 0
    assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "plain", "--device", "cpu", "-q") == 0
    for f in ("config.json", "generation_config.json"):
        (tmp_path / "q" / f).write_bytes((tmp_path / "m" / f).read_bytes())
    assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--device", "cpu", "-q", "--json") == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["format"] == "gpuq"
    a, b = load_folder(tmp_path / "d"), load_folder(tmp_path / "plain")
    assert a.keys() == b.keys() and all(np.array_equal(bits(a[k]), bits(b[k])) for k in a)
    assert _config(tmp_path / "d") == _config(tmp_path / "m")
    assert (tmp_path / "d" / "generation_config.json").exists()


def test_dequantize_dtype_option_and_config_dtype(tmp_path, capsys):
    make_model(tmp_path / "m")
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors", "--dtype", "float8_e4m3fn")
    assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--dtype", "float32", "--device", "cpu",
                     "-q") == 0
    t, q = load(tmp_path / "d" / "model.safetensors"), load(tmp_path / "q" / "model.safetensors")
    m = LINEARS[0]
    want = q[m + ".weight"].astype(np.float32) * q[m + ".weight_scale"].astype(np.float32)  # [out, 1] scales
    same_bits(t[m + ".weight"], want.astype(np.float32))
    assert t["model.norm.weight"].dtype == BF16  # kept tensors are kept as they are
    assert _config(tmp_path / "d")["dtype"] == "float32"


def _failing_write(monkeypatch, when):
    """Make the n-th tensor write of a run fail (a full disk, in effect)."""
    from gpuq.checkpoints import files

    real, calls = files._Writer.write, {"n": 0}

    def write(self, name, arr):
        calls["n"] += 1
        if calls["n"] == when:
            raise files.CliError(f"cannot write OUT {self.path!r}: [Errno 28] No space left on device")
        return real(self, name, arr)

    monkeypatch.setattr(files._Writer, "write", write)


@pytest.mark.parametrize("command", ["quantize", "dequantize"])
@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_run_leaves_out_as_it_was(tmp_path, capsys, monkeypatch, command, existing):
    make_model(tmp_path / "one", layers=2)
    reshard(tmp_path / "one", tmp_path / "m", lambda k: int("layers.1" in k), 2)
    src = tmp_path / "m"
    if command == "dequantize":
        _quantize(tmp_path / "m", tmp_path / "qq", "--format", "compressed-tensors")
        src = tmp_path / "qq"
    out = tmp_path / "out"
    if existing:  # an earlier run's complete output
        args = ("--format", "compressed-tensors") if command == "quantize" else ()
        assert gpuq_main(command, src, "-o", out, "--device", "cpu", "-q", *args) == 0
    before = tree(out)
    _failing_write(monkeypatch, 30 if command == "quantize" else 15)  # in the second shard
    args = ("--format", "compressed-tensors", "--dtype", "int4") if command == "quantize" else ("--dtype", "float32")
    assert gpuq_main(command, src, "-o", out, "--device", "cpu", "-q", *args) == 2
    assert "No space left on device" in one_error_line(capsys)
    assert tree(out) == before


# --- what is refused: one line, exit 2, nothing written ---------------------------------------------

@pytest.mark.parametrize("options,message", [
    (("--dtype", "uint4"), "--format compressed-tensors takes --dtype int8, int4, float8_e4m3fn, got uint4"),
    (("--dtype", "float8_e5m2"), "takes --dtype int8, int4, float8_e4m3fn, got float8_e5m2"),
    (("--per-tensor",), "--per-tensor: vLLM's kernels for int8 weights (wNa16) take channel or group scales"),
    (("--axis", "1"), "--axis 1: compressed-tensors scales output channels"),
    (("--dtype", "float8_e4m3fn", "--asymmetric"), "float8_e4m3fn has no zero point"),
    (("--dtype", "float8_e4m3fn", "--group-size", "32"), "float8_e4m3fn has no zero point"),
    (("--group-size", "32", "--axis", "0"), "--group-size groups along the input dimension (axis 1), got --axis 0"),
    (("--workers", "2"), "--format compressed-tensors runs on this machine: drop --scheduler/--workers"),
    (("--dtype", "int4", "--group-size", "0"), "--group-size must be a positive integer, got 0"),
    (("--dtype", "int4", "--group-size", "-128"), "--group-size must be a positive integer, got -128"),
    (("--block", "128x128"), "--block 128x128: --format fp8-blocks has 128x128 blocks (its weight_block_size), "
                             "and compressed-tensors is written per channel, group or tensor"),
])
def test_compressed_tensors_options_refused(tmp_path, capsys, options, message):
    make_model(tmp_path / "m")
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors",
                     *options) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("options", [("--dtype", "int8"), ("--group-size", "128"), ("--per-tensor",),
                                     ("--axis", "0"), ("--asymmetric",), ("--block", "64x64")])
def test_fp8_blocks_has_one_scheme(tmp_path, capsys, options):
    make_model(tmp_path / "m")
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "fp8-blocks", *options) == 2
    assert re.search(r"--format fp8-blocks has (one scheme, float8_e4m3fn with one scale per )?128x128 block",
                     one_error_line(capsys))
    # --block 128x128 says what the format does: accepted
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "fp8-blocks", "--block",
                     "128x128", "-q", "--device", "cpu") == 0


def _edit(folder, fn):
    cfg = _config(folder)
    fn(cfg)
    Path(folder, "config.json").write_text(json.dumps(cfg))


def _qc_edit(fn):
    return lambda cfg: fn(cfg["quantization_config"])


@pytest.mark.parametrize("edit,message", [
    (_qc_edit(lambda qc: qc.update(quant_method="gptq")),
     "quantization_config quant_method 'gptq' is not one gpuq reads (compressed-tensors, fp8 with weight_block_size"),
    (_qc_edit(lambda qc: qc.update(format="marlin-24") or qc["config_groups"]["group_0"].update(format=None)),
     "format 'marlin-24' (config group 'group_0'): gpuq reads pack-quantized, naive-quantized, float-quantized, "
     "int-quantized"),
    (_qc_edit(lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits=3)),
     "weights of type 'int' with num_bits 3: gpuq reads int with 4 or 8 bits"),
    (_qc_edit(lambda qc: qc["config_groups"]["group_0"].update(input_activations={"dynamic": False, "num_bits": 8})),
     "(static activation scales): gpuq reads weight-only or dynamic-activation quantization"),
    (_qc_edit(lambda qc: qc.update(sparsity_config={"format": "sparse-24-bitmask"})),
     "sparsity_config {\"format\": \"sparse-24-bitmask\"}: gpuq reads weight-only"),
    (_qc_edit(lambda qc: qc.update(quantization_status="frozen")),
     "quantization_status 'frozen': gpuq reads compressed checkpoints"),
    (_qc_edit(lambda qc: qc["config_groups"]["group_0"]["weights"].update(actorder="group")),
     "weights actorder 'group' (activation order, weight_g_idx) is not supported"),
    (_qc_edit(lambda qc: qc["config_groups"]["group_0"].update(targets=["re:.*mlp.*"])),
     "module 'model.layers.0.self_attn.k_proj' holds quantized tensors but no config group's targets match it"),
    (_qc_edit(lambda qc: qc["ignore"].append("model.layers.0.self_attn.q_proj")),
     "module 'model.layers.0.self_attn.q_proj' holds quantized tensors but the config's ignore list names it"),
    (_qc_edit(lambda qc: qc["config_groups"]["group_0"]["weights"].update(symmetric=True)),
     "tensor 'model.layers.0.mlp.down_proj.weight_zero_point' is a quantization parameter of no quantized weight"),
    (lambda cfg: cfg.update(quantization_config=[1]), "quantization_config is list, not an object"),
    (_qc_edit(lambda qc: qc["ignore"].append("re:(")),
     "ignore entry 're:(' is not a regular expression (missing ), unterminated subpattern at position 0)"),
    (_qc_edit(lambda qc: qc["config_groups"]["group_0"].update(targets=["Linear", "re:[a-"])),
     "config group 'group_0': targets entry 're:[a-' is not a regular expression"),
    (_qc_edit(lambda qc: qc["config_groups"]["group_0"]["weights"].update(strategy="block", block_structure=128)),
     "config group 'group_0': block strategy with block_structure 128: gpuq reads a list of two block sizes"),
    (_qc_edit(lambda qc: qc.update(format="naive-quantized") or qc["config_groups"]["group_0"].update(format=None)),
     "config group 'group_0': naive-quantized with num_bits 4: gpuq reads 4-bit int weights as pack-quantized"),
])
def test_unknown_or_unsupported_configs(tmp_path, capsys, edit, message):
    import shutil

    shutil.copytree(FIXTURES / "ct-int4-g128-asym", tmp_path / "in")
    _edit(tmp_path / "in", edit)
    assert gpuq_main("dequantize", tmp_path / "in", "-o", tmp_path / "out") == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("qc,message", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic"},
     "quant_method 'fp8' without weight_block_size (per-tensor fp8, weight_scale)"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"},
     "fmt None, activation_scheme 'static': gpuq reads fine-grained fp8 with fmt 'e4m3' and dynamic activations"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size [128] is not two positive sizes"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "ignored_layers": "lm_head"},
     "ignored_layers 'lm_head' is not a list of module names"),
])
def test_unsupported_fp8_configs(tmp_path, capsys, qc, message):
    import shutil

    shutil.copytree(FIXTURES / "fp8-blocks", tmp_path / "in")
    _edit(tmp_path / "in", lambda cfg: cfg.update(quantization_config=qc))
    assert gpuq_main("dequantize", tmp_path / "in", "-o", tmp_path / "out") == 2
    assert message in one_error_line(capsys)


@pytest.mark.parametrize("damage,message", [
    (lambda t: t.pop("model.layers.0.mlp.up_proj.weight_scale"),
     "module 'model.layers.0.mlp.up_proj' (int4 asym g=128, PackQuantized): tensor "
     "'model.layers.0.mlp.up_proj.weight_scale' is missing from IN"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight_shape": np.array([128, 64], np.int64)}),
     "tensor 'model.layers.0.mlp.up_proj.weight_packed' is int32 [128, 16], expected int32 [128, 8] for "
     "weight_shape [128, 64] at 4 bits"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight_scale":
                         -t["model.layers.0.mlp.up_proj.weight_scale"]}),
     "module 'model.layers.0.mlp.up_proj': scales must be finite and > 0"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight_scale":
                         t["model.layers.0.mlp.up_proj.weight_scale"].astype(np.float64)}),
     "tensor 'model.layers.0.mlp.up_proj.weight_scale' is float64: scales are bfloat16, float16 or float32"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight_zero_point":
                         t["model.layers.0.mlp.up_proj.weight_zero_point"][:1]}),
     "tensor 'model.layers.0.mlp.up_proj.weight_zero_point' is int32 [1, 1], expected int32 [16, 1]"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.input_scale": np.ones((1,), BF16)}),
     "tensor 'model.layers.0.mlp.up_proj.input_scale' is a quantization parameter of no quantized weight"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight": np.ones((128, 128), BF16)}),
     "module 'model.layers.0.mlp.up_proj' holds both 'model.layers.0.mlp.up_proj.weight_packed' and a dense "
     "'model.layers.0.mlp.up_proj.weight': which one is the weight?"),
    (lambda t: t.update({"model.layers.9.mlp.up_proj.weight_scale": np.ones((4, 1), BF16)}),
     "module 'model.layers.9.mlp.up_proj' (int4 asym g=128, PackQuantized): tensor "
     "'model.layers.9.mlp.up_proj.weight_packed' is missing from IN"),
])
def test_damaged_tensors(tmp_path, capsys, damage, message):
    import shutil

    from gpuq.checkpoints.files import write_checkpoint

    shutil.copytree(FIXTURES / "ct-int4-g128-asym", tmp_path / "in")
    t = load(tmp_path / "in" / "model.safetensors")
    damage(t)
    write_checkpoint(str(tmp_path / "in" / "model.safetensors"), "safetensors", t, None)
    assert gpuq_main("dequantize", tmp_path / "in", "-o", tmp_path / "out", "--device", "cpu") == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt,scale", [("compressed-tensors", "weight_scale"), ("fp8-blocks", "weight_scale_inv")])
def test_a_float8_weight_without_its_scale_is_refused(tmp_path, capsys, fmt, scale):
    """Raw e4m3 codes are no dense weight: a quantized module's float8 M.weight without its
    scale is damaged input (as a pack-quantized weight without its scale is)."""
    from gpuq.checkpoints.files import write_checkpoint

    make_model(tmp_path / "m")
    options = ("--dtype", "float8_e4m3fn") if fmt == "compressed-tensors" else ()
    _quantize(tmp_path / "m", tmp_path / "in", "--format", fmt, *options)
    t = load(tmp_path / "in" / "model.safetensors")
    del t[f"model.layers.0.mlp.down_proj.{scale}"]
    write_checkpoint(str(tmp_path / "in" / "model.safetensors"), "safetensors", t, None)
    assert gpuq_main("dequantize", tmp_path / "in", "-o", tmp_path / "out", "--device", "cpu") == 2
    assert (f"module 'model.layers.0.mlp.down_proj' (float8_e4m3fn" in (line := one_error_line(capsys))
            and f"tensor 'model.layers.0.mlp.down_proj.{scale}' is missing from IN" in line), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["compressed-tensors", "fp8-blocks", "gpuq-file", "gpuq-sharded"])
def test_dequantize_nonfinite(tmp_path, capsys, fmt):
    """NaN fp8 codes (0x7f, 0xff) restore to NaN: --nonfinite warn (default) writes them with one
    warning line a tensor and its count, error refuses them (exit 2, nothing written), allow
    keeps quiet. The same for gpuq's own files, one or sharded (dequantize_file)."""
    from gpuq.checkpoints.files import write_checkpoint

    make_model(tmp_path / "m")
    name = "model.layers.0.mlp.down_proj.weight"
    if fmt == "gpuq-file":
        src, q, weights = tmp_path / "m" / "model.safetensors", tmp_path / "q.safetensors", tmp_path / "q.safetensors"
        _quantize(src, q, "--dtype", "float8_e4m3fn")
    elif fmt == "gpuq-sharded":  # a sharded checkpoint, not a model folder: no config.json
        reshard(tmp_path / "m", tmp_path / "s", lambda n: int("mlp" in n), 2)
        os.remove(tmp_path / "s" / "config.json")
        q, weights = tmp_path / "q", tmp_path / "q" / "model-00002-of-00002.safetensors"
        _quantize(tmp_path / "s", q, "--dtype", "float8_e4m3fn")
    else:
        q, weights = tmp_path / "q", tmp_path / "q" / "model.safetensors"
        _quantize(tmp_path / "m", q, "--format", fmt, *(("--dtype", "float8_e4m3fn") if fmt != "fp8-blocks" else ()))
    from gpuq.checkpoints.files import Checkpoint

    with Checkpoint(str(weights)) as ckpt:
        t, meta, extra = {n: ckpt.load(n) for n in ckpt.names}, ckpt.meta, ckpt.extra_metadata
    t[name].view(np.uint8)[3, :3] = (0x7F, 0xFF, 0x7F)
    write_checkpoint(str(weights), "safetensors", t, meta, extra)
    file = fmt == "gpuq-file"
    out = tmp_path / ("d.safetensors" if file else "d")
    assert gpuq_main("dequantize", q, "-o", out, "--device", "cpu", "--nonfinite", "error") == 2
    assert f"tensor {name!r} dequantizes to 3 non-finite values (3 NaN)" in one_error_line(capsys)
    assert not out.exists()
    assert gpuq_main("dequantize", q, "-o", out, "--device", "cpu", "-q") == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpuq: warning: tensor {name!r} dequantizes to 3 non-finite "
                                               f"values (3 NaN)"), err
    restored = load(out) if file else load_folder(out)
    assert np.isnan(restored[name].astype(np.float32)).sum() == 3
    assert gpuq_main("dequantize", q, "-o", tmp_path / ("a.safetensors" if file else "a"),
                     "--device", "cpu", "-q", "--nonfinite", "allow") == 0
    assert capsys.readouterr().err == ""


def test_folders_refused(tmp_path, capsys):
    make_model(tmp_path / "m")
    cases = [
        (("dequantize", tmp_path / "m", "-o", tmp_path / "o"),
         "is not quantized: config.json has no quantization_config and 'model.safetensors' carries no gpuq metadata"),
        (("quantize", FIXTURES / "ct-fp8-channel", "-o", tmp_path / "o", "--format", "compressed-tensors"),
         "is already quantized (config.json has a quantization_config"),
        (("quantize", tmp_path / "m" / "model.safetensors", "-o", tmp_path / "o", "--format", "compressed-tensors"),
         "must be a model folder (config.json and the safetensors weights), but it is a file"),
        (("quantize", tmp_path / "m", "-o", tmp_path / "o.safetensors", "--format", "fp8-blocks"),
         "OUT '" + str(tmp_path / "o.safetensors") + "' must be a folder"),
        (("quantize", tmp_path / "m", "-o", tmp_path / "m", "--format", "fp8-blocks"),
         "is the input folder; write to a new folder"),
        (("example", "--model-dir", tmp_path / "m"), "exists and is not an empty folder"),
        (("example",), "gpuq example takes OUT (a checkpoint file) or --model-dir DIR, one of them"),
    ]
    for args, message in cases:
        assert gpuq_main(*args) == 2, args
        assert message in one_error_line(capsys), args
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "model-00001-of-00002.safetensors").write_bytes(b"old")
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "other", "--format", "fp8-blocks") == 2
    assert "holds 'model-00001-of-00002.safetensors', which this run would not replace" in one_error_line(capsys)
    (tmp_path / "nocfg").mkdir()
    assert gpuq_main("quantize", tmp_path / "nocfg", "-o", tmp_path / "o2", "--format", "fp8-blocks") == 2
    assert "is not a model folder: no " in one_error_line(capsys)


@pytest.mark.parametrize("blocker", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_folder_in_the_way_keeps_the_earlier_model_whole(tmp_path, capsys, blocker):
    """A folder where this run writes a file is refused before anything of OUT is removed."""
    make_model(tmp_path / "m")
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors")
    (tmp_path / "q" / blocker).rename(tmp_path / "moved")
    (tmp_path / "q" / blocker / "x").mkdir(parents=True)
    before = {f: (tmp_path / "q" / f).read_bytes() for f in os.listdir(tmp_path / "q")
              if (tmp_path / "q" / f).is_file()}
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors",
                     "--dtype", "int4", "--device", "cpu", "-q") == 2
    assert f"{blocker!r} there is a folder, and this run writes a file of that name" in one_error_line(capsys)
    after = {f: (tmp_path / "q" / f).read_bytes() for f in os.listdir(tmp_path / "q")
             if (tmp_path / "q" / f).is_file()}
    assert after == before


def test_a_config_without_dtype(tmp_path, capsys):
    """float16 weights and no dtype in config.json: quantize records the dtype it inferred, and
    dequantize of a folder that names none takes the kept tensors' dtype, not float32."""
    make_model(tmp_path / "m", dtype="float16")
    _edit(tmp_path / "m", lambda cfg: cfg.pop("dtype"))
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors")
    assert _config(tmp_path / "q")["dtype"] == "float16"
    _edit(tmp_path / "q", lambda cfg: cfg.pop("dtype"))
    assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--device", "cpu", "-q") == 0
    d = load(tmp_path / "d" / "model.safetensors")
    assert {a.dtype for a in d.values()} == {np.dtype(np.float16)}
    assert _config(tmp_path / "d")["dtype"] == "float16"


def test_hidden_files_are_named_not_copied(tmp_path, capsys):
    make_model(tmp_path / "m")
    (tmp_path / "m" / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "fp8-blocks", "--device", "cpu",
                     "-q", "--json") == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert ".gitattributes" in report["left_out"] and not (tmp_path / "q" / ".gitattributes").exists()


def test_float64_and_nonfinite_weights(tmp_path, capsys):
    t = make_model(tmp_path / "m", dtype="float64")
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors") == 2
    assert "compressed-tensors stores scales in the model's dtype" in one_error_line(capsys)
    from gpuq.checkpoints.files import write_checkpoint

    make_model(tmp_path / "n")
    t = load(tmp_path / "n" / "model.safetensors")
    t[LINEARS[0] + ".weight"][1, 2] = np.nan
    write_checkpoint(str(tmp_path / "n" / "model.safetensors"), "safetensors", t, None)
    assert gpuq_main("quantize", tmp_path / "n", "-o", tmp_path / "q", "--format", "compressed-tensors",
                     "--nonfinite", "error") == 2
    assert f"tensor '{LINEARS[0]}.weight' has 1 non-finite value (1 NaN)" in one_error_line(capsys)
    assert gpuq_main("quantize", tmp_path / "n", "-o", tmp_path / "q", "--format", "compressed-tensors",
                     "-q") == 0
    assert "gpuq: warning: tensor 'model.layers.0.self_attn.q_proj.weight' has 1 non-finite value" in \
        capsys.readouterr().err


def test_scales_are_in_the_model_dtype(tmp_path, capsys):
    """A float16 model: float16 scales (rounded as choose_qparams(scale_dtype='float16') rounds them)."""
    src = make_model(tmp_path / "m", dtype="float16")
    _quantize(tmp_path / "m", tmp_path / "q", "--format", "compressed-tensors")
    t = load(tmp_path / "q" / "model.safetensors")
    x = src[LINEARS[0] + ".weight"].astype(np.float32)
    s = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    same_bits(t[LINEARS[0] + ".weight_scale"], s.astype(np.float16))


# --- gpuq example --model-dir -------------------------------------------------------------------------

def test_example_model_dir(tmp_path, capsys):
    assert gpuq_main("example", "--model-dir", tmp_path / "tiny") == 0
    assert capsys.readouterr().out == (f"wrote {tmp_path / 'tiny'}: 21 tensors, 2,229,504 parameters, "
                                       f"bfloat16, 4,459,008 bytes\n")
    cfg = _config(tmp_path / "tiny")
    t = load(tmp_path / "tiny" / "model.safetensors")
    assert sorted(os.listdir(tmp_path / "tiny")) == ["config.json", "model.safetensors"]
    assert t["model.layers.1.mlp.down_proj.weight"].shape == (cfg["hidden_size"], cfg["intermediate_size"])
    assert t["model.layers.0.self_attn.q_proj.weight"].shape == (cfg["num_attention_heads"] * cfg["head_dim"],
                                                                 cfg["hidden_size"])
    assert all(v.dtype == BF16 for v in t.values()) and cfg["dtype"] == "bfloat16"
    assert not any("inv_freq" in k for k in t)
    # the example's tensors, one file or a folder: the same generator
    from gpuq.checkpoints.example_data import example_tensors

    want = example_tensors(0, 768)["model.layers.0.mlp.up_proj.weight"].astype(BF16)
    same_bits(t["model.layers.0.mlp.up_proj.weight"], want)


def _readme_serving_section() -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return text.split("\n## Serving the result\n", 1)[1].split("\n## ", 1)[0]


def test_readme_serving_says_what_to_install_and_how_to_repair_routers():
    """One install line for loading the result (accelerate: transformers' fine-grained fp8), the
    router rule with its repair for folders written before it, and dequantize's --nonfinite."""
    section = _readme_serving_section()
    installs = [line for line in section.splitlines() if "pip install" in line]
    assert len(installs) == 1 and "`pip install torch compressed-tensors transformers accelerate`" in installs[0]
    rule = " ".join(section.split("**MoE routers stay in float**", 1)[1].split("\n- ", 1)[0].split())
    for name in ("`gate` under `mlp` or `block_sparse_moe`", "named `router`", "`shared_expert_gate`", "`MoE router`",
                 "repaired by `gpuq dequantize` and a new `gpuq quantize`"):
        assert name in rule, name
    assert "llm-compressor#1618" in section and "ragged edge blocks" in section
    assert "`--nonfinite warn`" in section
