"""The command's scale rules (issue 40 point 2, issue 37's command part): ``--scale-rule``.

Symmetric 4-bit integer codes default to the full-range rule, ``max|x| / 7.5`` (torchao's,
compressed-tensors' and GPTQ's), in gpuq's files, sharded runs and compressed-tensors folders;
``--scale-rule narrow`` keeps the array API's ``max|x| / 7``; int8 keeps ``/ 127`` unless asked.
Checked here: the stored scales against a plain NumPy statement of each rule (and, for a float32
model folder, compressed-tensors 0.20's ``calculate_qparams``), the codes against gpuq's API, the
report naming the rule, the file's metadata unchanged (the rule is the writer's choice), and every
combination the command refuses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuq
from gpuq import cli

ml_dtypes = pytest.importorskip("ml_dtypes")
from test_cli_formats import api_codes_bytes, read, same_bits, st_write  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))
from _serving import load, make_model  # noqa: E402

TINY = np.float32(np.finfo(np.float32).tiny)


def run(*args):
    return cli.main([str(a) for a in args])


def naive_scales(x, group, divisor):
    """``max(max|x| / divisor, tiny)`` in float32 over groups of ``group`` along the last dim
    (the last group ragged), one division a scale."""
    x = np.asarray(x, np.float32)
    n = x.shape[-1]
    amax = np.stack([np.abs(x[..., i:i + group]).max(axis=-1) for i in range(0, n, group)], axis=-1)
    return np.maximum(amax / np.float32(divisor), TINY).astype(np.float32)


def source(path, seed=40):
    """Odd sizes: a rank-2 weight with a ragged last group (300 = 2 * 128 + 44), a rank-3 one,
    an outlier per row, an all-zero row."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((17, 300)).astype(np.float32)
    a[:, 5] *= 20
    a[3] = 0
    t = {"model.a.weight": a, "model.b.weight": rng.standard_normal((3, 5, 129)).astype(np.float32),
         "model.norm": np.ones(7, np.float32)}
    st_write(path, t, {"format": "pt"})
    return t


@pytest.mark.parametrize("dtype,flags,divisor,rule", [
    ("int4", [], 7.5, "full"),                              # the new default
    ("int4", ["--scale-rule", "full"], 7.5, "full"),
    ("int4", ["--scale-rule", "narrow"], 7, "narrow"),      # the old rule, on request
    ("uint4", [], 7.5, "full"),
    ("int8", [], 127, "narrow"),                            # int8 keeps /127 (bench/NOTES.md)
    ("int8", ["--scale-rule", "full"], 127.5, "full"),
])
def test_gpuq_file_scales_follow_the_rule(tmp_path, capsys, dtype, flags, divisor, rule):
    src = tmp_path / "src.safetensors"
    x = source(src)
    out = tmp_path / "q.safetensors"
    group = ["--group-size", "128"] if dtype in ("int8",) else []
    assert run("quantize", src, "-o", out, "--dtype", dtype, "--symmetric", "--min-size", "16", "--device",
               "cpu", "-q", "--json", *group, *flags) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scale_rule"] == rule
    tensors, meta, _ = read(out)
    for name in ("model.a.weight", "model.b.weight"):
        scheme = meta["tensors"][name]
        assert "scale_rule" not in scheme  # ordinary float32 scales: the file does not record the rule
        assert meta["format_version"] == 2 if dtype.endswith("4") else meta["format_version"] in (1, 2)
        want = naive_scales(x[name], 128, divisor)
        assert same_bits(tensors[name + ".scales"], want), name
        s, z = gpuq.choose_qparams(x[name], axis=-1, group_size=128, dtype=dtype, symmetric=True,
                                   scale_rule="full" if rule == "full" else None)
        assert same_bits(np.asarray(s), want)
        q = gpuq.quantize(x[name], s, z, axis=-1, group_size=128, dtype=dtype)
        assert tensors[name].tobytes() == api_codes_bytes(q), name
        row = next(r for r in report["tensors"] if r["name"] == name)
        assert row["scheme"].get("scale_rule") == ("full" if rule == "full" else None)
        assert ("full-range" in row["scheme_text"]) == (rule == "full")
    # the table says which rule (for 4-bit codes, whose default changed)
    assert run("quantize", src, "-o", tmp_path / "t.safetensors", "--dtype", dtype, "--symmetric", "--min-size",
               "16", "--device", "cpu", "-q", *group, *flags) == 0
    table = capsys.readouterr().out
    if dtype.endswith("4"):
        assert f"note: symmetric {dtype} scales by the {'full-range' if rule == 'full' else 'narrow'} rule" in table
    else:
        assert ("full-range rule" in table) == (rule == "full")


def test_full_range_reaches_qmin_and_dequantizes_as_the_naive_formula(tmp_path, capsys):
    """A group whose most negative value is -max|x| gets the code -8 (the full range), and gpuq
    dequantize gives ``code * scale`` of the stored bytes."""
    x = np.zeros((2, 32), np.float32)
    x[0, :4] = [-7.5, 7.5, 3.0, 0.5]
    x[1, :3] = [1.0, -0.5, 0.25]
    st_write(tmp_path / "s.safetensors", {"w": x}, {"format": "pt"})
    assert run("quantize", tmp_path / "s.safetensors", "-o", tmp_path / "q.safetensors", "--dtype", "int4",
               "--symmetric", "--min-size", "1", "--device", "cpu", "-q") == 0
    t, meta, _ = read(tmp_path / "q.safetensors")
    assert t["w.scales"].ravel().tolist() == [1.0, np.float32(1.0) / np.float32(7.5)]
    codes = gpuq.unpack(gpuq.Codes(t["w"], (2, 32), "int4"))
    assert codes[0, :4].tolist() == [-8, 7, 3, 0]  # 7.5 / 1 clamps to 7, 0.5 ties to even 0
    assert run("dequantize", tmp_path / "q.safetensors", "-o", tmp_path / "d.safetensors", "--device", "cpu",
               "-q") == 0
    back, _, _ = read(tmp_path / "d.safetensors")
    s = np.repeat(t["w.scales"].reshape(2, 1), 32, axis=1)
    assert same_bits(back["w"], (codes.astype(np.float32) * s).astype(np.float32))


def test_sharded_run_takes_the_rule(tmp_path, capsys):
    """A sharded IN: every shard's int4 scales by the full-range rule (the schemes travel to each
    shard's job, here and on a cluster worker)."""
    from gpuq.checkpoints.files import write_checkpoint

    rng = np.random.default_rng(1)
    folder = tmp_path / "in"
    folder.mkdir()
    x = {f"l{i}.weight": rng.standard_normal((8, 130)).astype(np.float32) for i in range(2)}
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for i, (name, w) in enumerate(x.items()):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        write_checkpoint(str(folder / shard), "safetensors", {name: w}, None, {"format": "pt"})
        index["weight_map"][name] = shard
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert run("quantize", folder, "-o", tmp_path / "out", "--dtype", "int4", "--symmetric", "--min-size", "16",
               "--device", "cpu", "-q", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scale_rule"] == "full"
    for i, (name, w) in enumerate(x.items()):
        t, _, _ = read(tmp_path / "out" / f"model-0000{i + 1}-of-00002.safetensors")
        assert same_bits(t[name + ".scales"], naive_scales(w, 128, 7.5))


@pytest.mark.parametrize("dtype", ["float32"])
def test_compressed_tensors_int4_scales_equal_calculate_qparams(tmp_path, capsys, dtype):
    """A float32 model folder: the int4 default's stored weight_scale is compressed-tensors 0.20's
    ``calculate_qparams`` (symmetric, groups of 128) bit for bit, and the codes its scales' (gpuq's
    exact division); ``--scale-rule narrow`` gives max|x| / 7."""
    torch = pytest.importorskip("torch")
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    src = make_model(tmp_path / "m", hidden=128, inter=256, dtype=dtype, seed=9, extra=False)
    assert run("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors", "--dtype",
               "int4", "--device", "cpu", "-q", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scale_rule"] == "full"
    assert any(n.startswith("note: symmetric int4 scales by the full-range rule") for n in report["notes"])
    t = load(tmp_path / "q" / "model.safetensors")
    args = ct.QuantizationArgs(num_bits=4, symmetric=True, strategy="group", group_size=128)
    linears = [n[:-len(".weight_packed")] for n in t if n.endswith(".weight_packed")]
    assert linears
    for m in linears:
        w = torch.from_numpy(src[m + ".weight"])
        g = w.reshape(w.shape[0], -1, 128)
        want, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
        assert not zp.any()
        assert t[m + ".weight_scale"].dtype == np.float32
        np.testing.assert_array_equal(t[m + ".weight_scale"].view(np.uint32), want.numpy().view(np.uint32))
        assert same_bits(t[m + ".weight_scale"], naive_scales(src[m + ".weight"], 128, 7.5))
    assert run("quantize", tmp_path / "m", "-o", tmp_path / "n", "--format", "compressed-tensors", "--dtype",
               "int4", "--scale-rule", "narrow", "--device", "cpu", "-q") == 0
    capsys.readouterr()
    t = load(tmp_path / "n" / "model.safetensors")
    for m in linears:
        assert same_bits(t[m + ".weight_scale"], naive_scales(src[m + ".weight"], 128, 7))


@pytest.mark.parametrize("flags,message", [
    (["--dtype", "int4", "--scale-rule", "full"], "--scale-rule full is for symmetric integer codes (add "
                                                  "--symmetric), got int4 asymmetric"),
    (["--dtype", "float8_e4m3fn", "--scale-rule", "full"], "--scale-rule full is for symmetric integer codes, "
                                                           "got --dtype float8_e4m3fn"),
    (["--dtype", "int4", "--symmetric", "--scale-rule", "even"], "--scale-rule even is an MX rule: it needs "
                                                                 "--scales mx"),
    (["--dtype", "int8", "--scales", "mx"], "--scales mx (power-of-two e8m0 scales) is for float codes"),
    (["--dtype", "float6_e2m3fn", "--scales", "nvfp4"], "--scales nvfp4 (e4m3 block scales and a global "
                                                        "scale) is for --dtype float4_e2m1fn"),
    (["--dtype", "float4_e2m1fn", "--scales", "nvfp4", "--scale-rule", "floor"], "NVFP4's scales have one rule"),
    (["--dtype", "float4_e2m1fn", "--scales", "mx", "--scale-rule", "full"], "MX scales take floor, even, "
                                                                             "ceil, rceil"),
    (["--dtype", "float4_e2m1fn", "--calibrate", "mse"], "--calibrate mse with --scales mx"),
    (["--dtype", "int4", "--asymmetric", "--scale-rule", "full", "--format", "compressed-tensors"],
     "--scale-rule full is for symmetric integer codes"),
    (["--scale-rule", "full", "--format", "fp8-blocks"], "--scale-rule full is for symmetric integer codes"),
])
def test_refused_before_anything_is_read(tmp_path, capsys, flags, message):
    """One error line, exit 2, nothing written (IN does not even exist)."""
    assert run("quantize", tmp_path / "missing", "-o", tmp_path / "out", *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuq: error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_api_checks_the_options():
    from gpuq.checkpoints import quantize

    with pytest.raises(ValueError, match="scale_rule must be one of full, narrow, floor, even, ceil, rceil"):
        quantize("a.safetensors", "b.safetensors", scale_rule="max")
    with pytest.raises(ValueError, match="scales must be one of float32, mx, nvfp4 or None, got 'e8m0'"):
        quantize("a.safetensors", "b.safetensors", scales="e8m0")


def test_compare_specs_name_the_rules(tmp_path, capsys):
    """``int4:sym`` is the full-range rule, ``int4:sym:narrow`` the old one: compare's SQNR is
    quantize's report for the same options."""
    src = tmp_path / "src.safetensors"
    source(src)
    assert run("compare", src, "--scheme", "int4:sym", "--scheme", "int4:sym:narrow", "--min-size", "16",
               "--device", "cpu", "--json") == 0
    cmp = json.loads(capsys.readouterr().out)
    assert [s["text"] for s in cmp["schemes"]] == ["int4 sym full-range axis=-1 g=128", "int4 sym axis=-1 g=128"]
    for k, flags in enumerate([[], ["--scale-rule", "narrow"]]):
        assert run("quantize", src, "-o", tmp_path / f"q{k}.safetensors", "--dtype", "int4", "--symmetric",
                   "--min-size", "16", "--device", "cpu", "-q", "--json", *flags) == 0
        report = json.loads(capsys.readouterr().out)
        assert cmp["total"]["sqnr_db"][k] == report["total"]["sqnr_db"]
    assert cmp["total"]["sqnr_db"][0] > cmp["total"]["sqnr_db"][1]  # Gaussian weights: the full range wins
