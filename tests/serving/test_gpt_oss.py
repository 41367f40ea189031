"""gpt-oss's MXFP4 (--format gpt-oss-mxfp4, and gpuq dequantize of such folders), without torch.

The references are independent of gpuq's code: a block decoded as ``e2m1 * 2**(b - 127)`` in
float64 with the nibbles split by hand, rounded through float32 (exact there) by NumPy and
ml_dtypes; a weight encoded by the MX rules stated with ``math.frexp`` (test_mx_scales'
``_naive_k``) and ml_dtypes' e2m1 cast (round half to even, saturating), packed low nibble
first. test_gpt_oss_transformers.py checks the same against transformers 5.24 itself.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import gpuq
from _serving import BF16, bits, gpuq_main, load, load_folder, one_error_line, reshard, same_bits, tree
from gpuq.checkpoints.formats import gpt_oss
from gpuq.checkpoints.formats.gpt_oss_experts import dequantize_experts
from test_mx_scales import _naive_k

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
EXPERTS = ("gate_up_proj", "down_proj")


def ref_decode(blocks, scales, dtype="bfloat16") -> np.ndarray:
    """``[E, in, out]`` from the published layout, one nibble at a time in float64."""
    lo, hi = blocks & 15, blocks >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:3], 32)  # input 2j low, 2j + 1 high
    mag = np.float64(E2M1)[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    with np.errstate(over="ignore"):
        val = (mag * np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None]).astype(np.float32)
    dense = val.reshape(blocks.shape[0], blocks.shape[1], -1)  # [E, out, in]
    return np.ascontiguousarray(dense.transpose(0, 2, 1)).astype(BF16 if dtype == "bfloat16" else dtype)


def ref_encode(w, rule="even") -> tuple:
    """``(blocks, scales)`` of one expert's ``[in, out]`` weight by the rule, in plain NumPy."""
    x = np.asarray(w, np.float32).T.reshape(w.shape[1], -1, 32)  # [out, groups, 32]
    k = np.vectorize(lambda a: _naive_k(float(a), "float4_e2m1fn", rule))(np.abs(x).max(-1))
    codes = (x / np.ldexp(np.float32(1), k)[..., None]).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    return (codes[..., 0::2] | codes[..., 1::2] << 4).astype(np.uint8), (k + 127).astype(np.uint8)


def make_gpt_oss(folder, *, experts=3, hidden=64, inter=96, layers=2, dtype=BF16, seed=0,
                 nonfinite=False) -> dict:
    """A gpt-oss-shaped model folder (tensor names and shapes of transformers 5.24's
    GptOssForCausalLM, random values; no forward pass needed here). ``nonfinite``: layer 0's
    ``gate_up_proj`` gets a NaN, a +Inf, a -Inf and an all-zero group of 32 (experts >= 2,
    hidden >= 32), the one pass's edge rows."""
    from gpuq.checkpoints.files import write_checkpoint

    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.normal(0, 0.02, shape) * np.exp(rng.uniform(-2, 2, shape[:-1] + (1,)))).astype(dtype)

    t = {"model.embed_tokens.weight": w(128, hidden), "lm_head.weight": w(128, hidden),
         "model.norm.weight": w(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(64, hidden), p + "self_attn.q_proj.bias": w(64),
                  p + "self_attn.sinks": w(4), p + "input_layernorm.weight": w(hidden),
                  p + "mlp.router.weight": w(experts, hidden), p + "mlp.router.bias": w(experts),
                  p + "mlp.experts.gate_up_proj": w(experts, hidden, 2 * inter),
                  p + "mlp.experts.gate_up_proj_bias": w(experts, 2 * inter),
                  p + "mlp.experts.down_proj": w(experts, inter, hidden),
                  p + "mlp.experts.down_proj_bias": w(experts, hidden)})
    if nonfinite:
        up = t["model.layers.0.mlp.experts.gate_up_proj"]
        up[1, 3, 7], up[0, 5, 1], up[0, 9, 2], up[1, :32, 4] = np.nan, np.inf, -np.inf, 0
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_checkpoint(str(Path(folder, "model.safetensors")), "safetensors", t, None, {"format": "pt"})
    config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": hidden,
              "intermediate_size": inter, "num_local_experts": experts, "num_hidden_layers": layers,
              "dtype": "bfloat16" if dtype == BF16 else np.dtype(dtype).name}
    Path(folder, "config.json").write_text(json.dumps(config))
    Path(folder, "tokenizer.json").write_text("{}")
    return t


def _run(*args, capsys=None) -> dict:
    assert gpuq_main(*args, "--device", "cpu", "-q", "--json") == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gptoss") / "bf16"
    return folder, make_gpt_oss(folder)


# --- the array decode ------------------------------------------------------------------------------

def _random_layout(e=3, rows=17, groups=5, seed=0):
    """Random blocks, every scale byte 0..254 once (3 * 17 * 5 = 255) in random places."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (e, rows, groups, 16), dtype=np.uint8)
    scales = rng.permutation(np.arange(255, dtype=np.uint8))[: e * rows * groups]
    return blocks, np.resize(scales, (e, rows, groups))


@pytest.mark.parametrize("rows", [17, 12])  # 12: the four-rows-per-store loop of 2-byte outputs
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_decode_is_the_product_rounded_once(host_loops, dtype, rows):
    blocks, scales = _random_layout(rows=rows, groups=5 if rows == 17 else 8)
    before = blocks.copy(), scales.copy()
    with np.errstate(over="ignore"):
        same_bits(dequantize_experts(blocks, scales, dtype), ref_decode(blocks, scales, dtype))
    np.testing.assert_array_equal(blocks, before[0])
    np.testing.assert_array_equal(scales, before[1])


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 33, 3), (5, 4, 2)])
def test_decode_odd_shapes_views_and_out(host_loops, shape):
    rng = np.random.default_rng(1)
    wide = rng.integers(0, 256, (shape[0], shape[1], shape[2] + 1, 16), dtype=np.uint8)
    blocks = wide[:, :, 1:]  # a strided view
    scales = rng.integers(0, 255, shape, dtype=np.uint8)
    want = ref_decode(np.ascontiguousarray(blocks), scales)
    same_bits(dequantize_experts(blocks, scales), want)
    out = np.full(want.shape, np.nan, BF16)
    for e in range(shape[0]):  # expert by expert into the rows of one output
        dequantize_experts(blocks[e:e + 1], scales[e:e + 1], out=out[e:e + 1])
    same_bits(out, want)
    raw = np.zeros(out.nbytes + 2, np.uint8)  # an output 2 bytes past an 8-byte boundary
    odd = raw[2:].view(BF16).reshape(want.shape)
    same_bits(dequantize_experts(blocks, scales, out=odd), want)


def test_decode_through_the_array_api_on_every_backend(backend):
    """The device path (gpuq.dequantize there, transposed there) gives the compiled table's bits."""
    blocks, scales = _random_layout(2, 9, 2, seed=2)
    xp = __import__("cupy") if backend.name == "cuda" else types.SimpleNamespace(ascontiguousarray=np.ascontiguousarray)
    device = types.SimpleNamespace(xp=xp, put=backend.put, get=backend.get, name=backend.name)
    same_bits(gpt_oss.decode(blocks, scales, "bfloat16", device, "p"), dequantize_experts(blocks, scales))


@pytest.mark.parametrize("args, message", [
    (dict(scales=np.full((1, 2, 1), 255, np.uint8)), "p: scale byte 255 \\(NaN\\) at expert 0, row 0, group 0"),
    (dict(blocks=np.zeros((1, 2, 1, 16), np.int8)), "p: blocks must be a uint8 NumPy array of rank 4"),
    (dict(scales=np.zeros((1, 2), np.uint8)), "p: scales must be a uint8 NumPy array of rank 3"),
    (dict(blocks=np.zeros((1, 2, 1, 8), np.uint8)), "p: blocks \\[1, 2, 1, 8\\] and scales \\[1, 2, 1\\] are not"),
    (dict(scales=np.zeros((1, 3, 1), np.uint8)), "are not \\[E, out, in/32, 16\\] and \\[E, out, in/32\\]"),
    (dict(out=np.zeros((1, 2, 32), BF16)), "p: out must be a writable C-contiguous bfloat16 array of shape "
                                           "\\[1, 32, 2\\]"),
    (dict(out=np.zeros((1, 32, 2), np.float32)), "out must be a writable C-contiguous bfloat16"),
])
def test_decode_refusals(args, message):
    kw = dict(blocks=np.zeros((1, 2, 1, 16), np.uint8), scales=np.zeros((1, 2, 1), np.uint8)) | args
    with pytest.raises(ValueError, match=message):
        dequantize_experts(kw.pop("blocks"), kw.pop("scales"), name="p", **kw)
    with pytest.raises(TypeError, match="dtype must be a dtype name"):
        dequantize_experts(np.zeros((1, 2, 1, 16), np.uint8), np.zeros((1, 2, 1), np.uint8), np.float32)


# --- the folder, written and read ------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["even", "floor", "ceil", "rceil"])
def test_quantize_writes_the_published_layout(tmp_path, capsys, model, rule):
    src, t = model
    if rule == "even":
        report = _run("quantize", src, "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", capsys=capsys)
    else:  # the library argument (the command's --scale-rule is another change's)
        report = gpuq.checkpoints.quantize(src, tmp_path / "q", format="gpt-oss-mxfp4", scale_rule=rule,
                                           device="cpu")
    out = load(tmp_path / "q" / "model.safetensors")
    for i in range(2):
        for p in EXPERTS:
            name = f"model.layers.{i}.mlp.experts.{p}"
            assert name not in out and out[name + "_blocks"].dtype == np.uint8
            for e in range(3):
                want_blocks, want_scales = ref_encode(t[name][e], rule)
                np.testing.assert_array_equal(out[name + "_blocks"][e], want_blocks)
                np.testing.assert_array_equal(out[name + "_scales"][e], want_scales)
    kept = {n for n in t if not n.endswith(EXPERTS)}
    assert all(bits(out[n]).tobytes() == bits(t[n]).tobytes() and out[n].dtype == t[n].dtype for n in kept)
    assert set(out) == kept | {f"model.layers.{i}.mlp.experts.{p}{s}" for i in range(2) for p in EXPERTS
                               for s in ("_blocks", "_scales")}
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}
    assert config["model_type"] == "gpt_oss" and (tmp_path / "q" / "tokenizer.json").exists()
    rows = {r["name"]: r for r in report["tensors"]}
    assert report["total"]["quantized"] == 4 and report["scale_rule"] == rule
    assert rows["model.layers.0.mlp.experts.down_proj"]["scheme_text"] == f"float4_e2m1fn g=32 e8m0 {rule}"


def test_round_trip_and_the_reported_error(tmp_path, capsys, model):
    src, t = model
    report = _run("quantize", src, "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", capsys=capsys)
    back = _run("dequantize", tmp_path / "q", "-o", tmp_path / "d", capsys=capsys)
    assert back["format"] == "gpt-oss MXFP4" and back["total"]["quantized"] == 4
    q, d = load(tmp_path / "q" / "model.safetensors"), load(tmp_path / "d" / "model.safetensors")
    assert set(d) == set(t) and json.loads((tmp_path / "d" / "config.json").read_text()).get(
        "quantization_config") is None
    signal = error = 0.0
    for name in t:
        if name.endswith(EXPERTS):
            same_bits(d[name], ref_decode(q[name + "_blocks"], q[name + "_scales"]))
            x, y = t[name].astype(np.float64), d[name].astype(np.float64)
            signal, error = signal + float((x * x).sum()), error + float(((x - y) ** 2).sum())
            row = next(r for r in report["tensors"] if r["name"] == name)
            assert row["max_abs_error"] == float(np.abs(x - y).max())
        else:
            same_bits(d[name], t[name])
    # the dense bfloat16 values are the float32 dequantization exactly: the report's SQNR is theirs
    assert report["total"]["sqnr_db"] == pytest.approx(10 * np.log10(signal / error), rel=1e-12)


def test_dequantize_dtype_option(tmp_path, capsys, model):
    _run("quantize", model[0], "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", capsys=capsys)
    _run("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--dtype", "float32", capsys=capsys)
    q, d = load(tmp_path / "q" / "model.safetensors"), load(tmp_path / "d" / "model.safetensors")
    name = "model.layers.1.mlp.experts.gate_up_proj"
    same_bits(d[name], ref_decode(q[name + "_blocks"], q[name + "_scales"], "float32"))
    assert json.loads((tmp_path / "d" / "config.json").read_text())["dtype"] == "float32"


def test_sharded_folder_keeps_its_shards_and_index(tmp_path, capsys, model):
    reshard(model[0], tmp_path / "s", lambda n: 1 if ".layers.1." in n else 0, 2)
    _run("quantize", tmp_path / "s", "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", capsys=capsys)
    index = json.loads((tmp_path / "q" / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.layers.1.mlp.experts.down_proj_scales"] == "model-00002-of-00002.safetensors"
    assert index["model.layers.0.mlp.experts.gate_up_proj_blocks"] == "model-00001-of-00002.safetensors"
    assert not any(n.endswith(EXPERTS) for n in index)
    _run("dequantize", tmp_path / "q", "-o", tmp_path / "d", capsys=capsys)
    index = json.loads((tmp_path / "d" / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.layers.1.mlp.experts.down_proj"] == "model-00002-of-00002.safetensors"
    assert not any(n.endswith(("_blocks", "_scales")) for n in index)
    q = load_folder(tmp_path / "q")
    name = "model.layers.1.mlp.experts.down_proj"
    same_bits(load_folder(tmp_path / "d")[name], ref_decode(q[name + "_blocks"], q[name + "_scales"]))


def test_expert_tensors_are_read_one_expert_at_a_time(tmp_path, capsys, model, monkeypatch):
    """Neither command loads a whole expert tensor (dense, blocks or scales): only rows of it."""
    from gpuq.checkpoints.files import Checkpoint

    whole = Checkpoint.load

    def load_but_not_experts(self, name):
        assert not name.endswith(EXPERTS + ("_blocks", "_scales")), name
        return whole(self, name)

    monkeypatch.setattr(Checkpoint, "load", load_but_not_experts)
    _run("quantize", model[0], "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", capsys=capsys)
    _run("dequantize", tmp_path / "q", "-o", tmp_path / "d", capsys=capsys)


def _edit(src, dst, edit):
    """A copy of folder ``src`` whose tensors ``edit`` changes (``edit(tensors)``, in place)."""
    import shutil

    from gpuq.checkpoints.files import write_checkpoint

    shutil.copytree(src, dst)
    t = load(Path(dst) / "model.safetensors")
    edit(t)
    write_checkpoint(str(Path(dst) / "model.safetensors"), "safetensors", t, None)
    return dst


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, model):
    out = tmp_path_factory.mktemp("gptoss-q") / "q"
    gpuq.checkpoints.quantize(model[0], out, format="gpt-oss-mxfp4", device="cpu")
    return out


def _set_scale(t):
    t["model.layers.1.mlp.experts.down_proj_scales"][2, 5, 1] = 255


@pytest.mark.parametrize("edit, message", [
    (_set_scale, "tensor 'model.layers.1.mlp.experts.down_proj_scales': scale byte 255 \\(NaN\\) at expert 2, "
                 "row 5, group 1: an e8m0 scale of a weight is 0..254"),
    (lambda t: t.pop("model.layers.0.mlp.experts.down_proj_blocks"),
     "tensor 'model.layers.0.mlp.experts.down_proj_scales' is the scales of no _blocks tensor"),
    (lambda t: t.pop("model.layers.0.mlp.experts.down_proj_scales"),
     "tensor 'model.layers.0.mlp.experts.down_proj_scales' is missing from IN"),
    (lambda t: t.update({"model.layers.0.mlp.experts.down_proj_blocks":
                         t["model.layers.0.mlp.experts.down_proj_blocks"].view(np.int8)}),
     "tensor 'model.layers.0.mlp.experts.down_proj_blocks' is int8 \\[3, 64, 3, 16\\]: gpt-oss MXFP4 blocks are uint8"),
    (lambda t: t.update({"model.layers.0.mlp.experts.down_proj_scales":
                         t["model.layers.0.mlp.experts.down_proj_scales"][:, :, :2].copy()}),
     "the scales of 'model.layers.0.mlp.experts.down_proj_blocks' are uint8 \\[3, 64, 3\\]"),
    (lambda t: t.update({"model.layers.0.mlp.experts.down_proj": np.zeros((3, 96, 64), BF16)}),
     "holds both 'model.layers.0.mlp.experts.down_proj_blocks' and a dense 'model.layers.0.mlp.experts.down_proj'"),
])
def test_damaged_folders_are_refused(tmp_path, capsys, quantized, edit, message):
    src = _edit(quantized, tmp_path / "bad", edit)
    assert gpuq_main("dequantize", src, "-o", tmp_path / "d", "-q") == 2
    assert re.search(message, one_error_line(capsys))
    assert tree(tmp_path / "d") is None


@pytest.mark.parametrize("options, message", [
    (("--dtype", "int8"), "--format gpt-oss-mxfp4 stores float4_e2m1fn codes with an e8m0 scale per 32 inputs"),
    (("--group-size", "16"), "drop --dtype, --group-size and --asymmetric"),
    (("--asymmetric",), "drop --dtype, --group-size and --asymmetric"),
    (("--axis", "0"), "drop --axis, --per-tensor and --block"),
    (("--exclude", "*.layers.0.*"), "quantizes every expert tensor"),
    (("--min-size", "0"), "drop --include, --exclude and --min-size"),
    (("--calibrate", "mse"), "--calibrate mse: MX scales come from each block's max"),
])
def test_options_refused(tmp_path, capsys, model, options, message):
    assert gpuq_main("quantize", model[0], "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", "-q", *options) == 2
    assert message in one_error_line(capsys)
    assert tree(tmp_path / "q") is None


def test_library_scale_rule_checked():
    # gpt-oss's MX format takes the MX rules only; the other formats take every rule name
    # (checked against the code type by the command: tests/test_cli_scale_rules.py).
    with pytest.raises(ValueError, match="scale_rule for format='gpt-oss-mxfp4' must be one of floor, even, ceil, "
                                         "rceil, got 'full'"):
        gpuq.checkpoints.quantize("a", "b", format="gpt-oss-mxfp4", scale_rule="full")
    with pytest.raises(ValueError, match="scale_rule must be one of .*got 'nearest'"):
        gpuq.checkpoints.quantize("a", "b", format="compressed-tensors", scale_rule="nearest")


def _config_edit(key, value):
    def edit(folder):
        path = Path(folder, "config.json")
        path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    return edit


@pytest.mark.parametrize("change, message", [
    (_config_edit("model_type", "llama"), "is a 'llama' model: --format gpt-oss-mxfp4 writes gpt-oss"),
    (_config_edit("quantization_config", {"quant_method": "mxfp4"}), "is already quantized"),
])
def test_inputs_refused(tmp_path, capsys, model, change, message):
    import shutil

    shutil.copytree(model[0], tmp_path / "in")
    change(tmp_path / "in")
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", "-q") == 2
    assert message in one_error_line(capsys)


def test_input_dimension_must_be_a_multiple_of_32(tmp_path, capsys):
    make_gpt_oss(tmp_path / "in", hidden=48)
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", "-q") == 2
    assert ("tensor 'model.layers.0.mlp.experts.gate_up_proj' [3, 48, 192]: its input dimension 48 is no "
            "multiple of 32") in one_error_line(capsys)


def test_nonfinite_weights(tmp_path, capsys, model):
    def nan(t):
        t["model.layers.0.mlp.experts.gate_up_proj"][1, 3, 7] = np.nan

    src = _edit(model[0], tmp_path / "nan", nan)
    assert gpuq_main("quantize", src, "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", "-q",
                     "--nonfinite", "error") == 2
    assert "tensor 'model.layers.0.mlp.experts.gate_up_proj' has 1 non-finite value (1 NaN) (expert 1)" in \
        one_error_line(capsys)
    with pytest.warns(gpuq.checkpoints.GpuqWarning, match="has 1 non-finite value .1 NaN.: quantized with scales "
                                                          "from its finite values"):
        report = gpuq.checkpoints.quantize(src, tmp_path / "q", format="gpt-oss-mxfp4", device="cpu")
    assert report["total"]["nonfinite"] == {"nan": 1, "posinf": 0, "neginf": 0}
    # the scales come from the finite values: those of the weight with its NaN as 0
    x = load(src / "model.safetensors")["model.layers.0.mlp.experts.gate_up_proj"][1].astype(np.float32)
    got = load(tmp_path / "q" / "model.safetensors")["model.layers.0.mlp.experts.gate_up_proj_scales"][1]
    np.testing.assert_array_equal(got, ref_encode(np.where(np.isnan(x), 0, x))[1])


def test_dequantize_overflow_is_reported(tmp_path, capsys, quantized):
    def huge(t):
        t["model.layers.0.mlp.experts.gate_up_proj_scales"][0, 0, 0] = 254
        t["model.layers.0.mlp.experts.gate_up_proj_blocks"][0, 0, 0] = 0
        t["model.layers.0.mlp.experts.gate_up_proj_blocks"][0, 0, 0, 0] = 0x07  # 6 * 2**127: inf in bfloat16

    src = _edit(quantized, tmp_path / "huge", huge)
    assert gpuq_main("dequantize", src, "-o", tmp_path / "d", "-q", "--nonfinite", "error") == 2
    assert "tensor 'model.layers.0.mlp.experts.gate_up_proj' dequantizes to 1 non-finite value (1 +Inf)" in \
        one_error_line(capsys)
    with pytest.warns(gpuq.checkpoints.GpuqWarning, match="dequantizes to 1 non-finite value"):
        gpuq.checkpoints.dequantize(src, tmp_path / "d", device="cpu")
    assert load(tmp_path / "d" / "model.safetensors")["model.layers.0.mlp.experts.gate_up_proj"][0, 0, 0] == np.inf


def test_inspect_and_the_table(tmp_path, capsys, model, quantized):
    info = gpuq.checkpoints.inspect(quantized)
    roles = {t["name"]: t["role"] for t in info["tensors"]}
    assert info["format"] == "gpt-oss-mxfp4" and info["quant_method"] == "mxfp4"
    assert roles["model.layers.0.mlp.experts.gate_up_proj_blocks"] == "quantized"
    assert roles["model.layers.0.mlp.experts.gate_up_proj_scales"] == "parameter"
    assert roles["model.layers.0.mlp.experts.gate_up_proj_bias"] == "kept"
    assert info["dequantize_dtype"] == "bfloat16"
    assert gpuq_main("quantize", model[0], "-o", tmp_path / "q", "--format", "gpt-oss-mxfp4", "-q",
                     "--device", "cpu") == 0
    text = capsys.readouterr().out
    assert "gpt-oss-mxfp4, device: cpu" in text and "float4_e2m1fn g=32 e8m0 even" in text
    assert "note: 4 expert tensors in gpt-oss's MXFP4" in text
