"""fp4/fp6 codes and MX/NVFP4 scales in gpuq's own file format (issue 37's command part), version 5.

``gpuq quantize --dtype float4_e2m1fn | float6_e2m3fn | float6_e3m2fn`` with ``--scales mx``
(the default: power-of-two scales by ``--scale-rule``, stored as e8m0 bytes), ``--scales nvfp4``
(e4m3 block scales per 16, stored F8_E4M3, and ``NAME.global_scale`` F32 [1]) or ``--scales
float32``; MX scales for fp8 too. Checked here, on odd shapes (counts with a padding nibble, ragged
groups, rank 3, an all-zero row, outliers): the stored codes and scales against gpuq's array API
and a naive NumPy statement (ml_dtypes' rounding of ``x / s``, ``2**(byte - 127)``, the floor rule
from ``frexp``), ``gpuq dequantize`` against ``gpuq.dequantize`` and the naive product, the
metadata, the refusals of damaged files, an older reader's refusal, and ``gpuq compare``'s specs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import gpuq
from gpuq import cli
from gpuq.checkpoints.files import write_checkpoint

ml_dtypes = pytest.importorskip("ml_dtypes")
from test_cli_formats import (FORMATS, api_codes_bytes, read, refused_after_edit, same_bits,  # noqa: E402
                              st_write, unpack_nibbles, write)

ELEMENT = {"float4_e2m1fn": ml_dtypes.float4_e2m1fn, "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
           "float6_e3m2fn": ml_dtypes.float6_e3m2fn, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
MAX = {"float4_e2m1fn": 6.0, "float6_e2m3fn": 7.5, "float6_e3m2fn": 28.0, "float8_e4m3fn": 448.0}
EMAX = {"float4_e2m1fn": 2, "float6_e2m3fn": 2, "float6_e3m2fn": 4, "float8_e4m3fn": 8}

# name -> (dtype, flags, scales, rule, group)
CASES = {
    "fp4-default": ("float4_e2m1fn", [], "mx", "even", 32),
    "fp4-floor": ("float4_e2m1fn", ["--scale-rule", "floor"], "mx", "floor", 32),
    "fp4-nvfp4": ("float4_e2m1fn", ["--scales", "nvfp4"], "nvfp4", None, 16),
    "fp4-float32-g16": ("float4_e2m1fn", ["--scales", "float32", "--group-size", "16"], "float32", None, 16),
    "e2m3-rceil": ("float6_e2m3fn", ["--scale-rule", "rceil"], "mx", "rceil", 32),
    "e3m2-floor-g8": ("float6_e3m2fn", ["--scale-rule", "floor", "--group-size", "8"], "mx", "floor", 8),
    "fp8-mx-ceil": ("float8_e4m3fn", ["--scales", "mx", "--scale-rule", "ceil"], "mx", "ceil", 32),
}
SCALE_DTYPE = {"float32": "float32", "mx": "float8_e8m0fnu", "nvfp4": "float8_e4m3fn"}


def run(*args):
    return cli.main([str(a) for a in args])


def source_tensors(fmt, seed=37):
    """Odd counts (a padding nibble for fp4), ragged last groups (33 = 32 + 1, 35), rank 3, an
    all-zero row, outliers, bfloat16 (safetensors) or float16 (npz) beside float32, a kept 1-D."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((17, 33)).astype(np.float32)
    a[2] = 0
    a[::5, 7] *= 40
    b = (rng.standard_normal((3, 5, 35)) * 1e-3).astype(ml_dtypes.bfloat16 if fmt == "safetensors"
                                                        else np.float16)
    return {"m.a.weight": a, "m.b.weight": b, "m.norm": np.ones(9, np.float32)}


def quantize_source(tmp_path, fmt, flags, capsys):
    src = tmp_path / f"src.{fmt}"
    t = source_tensors(fmt)
    write_checkpoint(str(src), fmt, t, None)
    out = tmp_path / f"q.{fmt}"
    assert run("quantize", src, "-o", out, "--min-size", "16", "--device", "cpu", "-q", "--json", *flags) == 0, \
        capsys.readouterr().err
    return t, out, json.loads(capsys.readouterr().out)


def naive_groups(x, group):
    """float32 ``max|x|`` of each group of ``group`` along the last dim (the last one ragged)."""
    x = np.asarray(x, np.float32)
    return np.stack([np.abs(x[..., i:i + group]).max(axis=-1) for i in range(0, x.shape[-1], group)], -1)


def repeat(s, shape, group):
    """Each group's scale beside each of its elements."""
    return np.repeat(s, group, axis=-1)[..., :shape[-1]]


def naive_codes(x, s_full, dtype):
    """The element type's RNE of the float32 quotient, saturated (ml_dtypes' cast), as bytes;
    fp4 packed two a byte, element 2k in the low nibble."""
    q = np.clip(np.asarray(x, np.float32) / s_full, -MAX[dtype], MAX[dtype]).astype(np.float32)
    bits = q.astype(ELEMENT[dtype]).view(np.uint8).reshape(-1)
    if dtype != "float4_e2m1fn":
        return bits
    bits = np.concatenate([bits, np.zeros(bits.size % 2, np.uint8)])
    return (bits[0::2] | (bits[1::2] << 4)).astype(np.uint8)


def decode(stored, dtype, shape):
    """float32 values of the stored codes."""
    if dtype == "float4_e2m1fn":
        nib = unpack_nibbles(stored, math.prod(shape), False).astype(np.uint8)
        return nib.view(ml_dtypes.float4_e2m1fn).astype(np.float32).reshape(shape)
    return stored.view(np.uint8).view(ELEMENT[dtype]).astype(np.float32).reshape(shape)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_codes_scales_and_round_trip(tmp_path, capsys, fmt, case):
    dtype, flags, scales, rule, group = CASES[case]
    src, out, report = quantize_source(tmp_path, fmt, ["--dtype", dtype, *flags], capsys)
    tensors, meta, _ = read(out)
    assert meta["format_version"] == 5
    assert report["scales"] == scales and report["scale_rule"] == rule
    rows = {r["name"]: r for r in report["tensors"]}
    assert "m.norm" not in meta["tensors"]
    for name in ("m.a.weight", "m.b.weight"):
        x = src[name]
        s_meta = meta["tensors"][name]
        want_keys = {"dtype", "symmetric", "axis", "group_size", "source_dtype", "scale_dtype", "scale_rule"}
        if dtype == "float4_e2m1fn":
            want_keys |= {"shape", "packing"}
            assert s_meta["shape"] == list(x.shape) and s_meta["packing"] == "onnx_nibbles"
        assert set(s_meta) == want_keys
        assert (s_meta["dtype"], s_meta["symmetric"], s_meta["axis"], s_meta["group_size"]) == (
            dtype, True, x.ndim - 1, group)
        assert (s_meta["scale_dtype"], s_meta["scale_rule"]) == (SCALE_DTYPE[scales], rule)
        # The array API on the same tensor.
        kw = dict(axis=-1, group_size=group, dtype=dtype)
        rule_kw = {} if scales == "float32" else {"scale_dtype": SCALE_DTYPE[scales]}
        if scales == "mx":
            rule_kw["scale_rule"] = rule
        gs = gpuq.global_scale(x) if scales == "nvfp4" else None
        s, _ = gpuq.choose_qparams(x, **kw, **rule_kw, **({} if gs is None else {"global_scale": gs}))
        s = np.asarray(s)
        q = gpuq.quantize(x, s, **kw, **({} if gs is None else {"global_scale": gs}))
        stored = tensors[name]
        assert stored.dtype == np.uint8 or (dtype == "float8_e4m3fn" and fmt == "safetensors")
        assert stored.tobytes() == api_codes_bytes(q), name
        # What the file stores for the scales, and the naive statement of each.
        st = tensors[name + ".scales"]
        pshape = x.shape[:-1] + (-(-x.shape[-1] // group),)
        assert st.shape == pshape
        amax = naive_groups(x, group)
        if scales == "mx":
            assert st.dtype == np.uint8 and same_bits(st, gpuq.e8m0_bytes(s))
            s_naive = np.ldexp(np.float32(1), st.astype(np.int32) - 127).astype(np.float32)
            assert same_bits(s_naive, s)
            if rule == "floor":  # OCP's rule: k = exponent(amax) - emax, clamped; zero blocks 2**-127
                _, e = np.frexp(amax)
                k = np.where(amax > 0, np.clip(e.astype(np.int32) - 1 - EMAX[dtype], -127, 127), -127)
                assert np.array_equal(st.astype(np.int32) - 127, k)
            s_use = s_naive
        elif scales == "nvfp4":
            assert st.dtype == (np.dtype(ml_dtypes.float8_e4m3fn) if fmt == "safetensors" else np.uint8)
            sb = st.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            assert same_bits(sb, s)
            g = tensors[name + ".global_scale"]
            assert g.dtype == np.float32 and g.shape == (1,) and g[0] == gs
            assert sb[np.all(amax == 0, axis=-1)].tolist() == [] or np.all(sb[amax == 0] == 0.125)
            s_use = (sb / g[0]).astype(np.float32)
        else:
            assert st.dtype == np.float32 and same_bits(st, s)
            assert same_bits(st, np.maximum(amax / np.float32(MAX[dtype]), np.finfo(np.float32).tiny))
            s_use = st
        assert (name + ".global_scale" in tensors) == (scales == "nvfp4")
        assert name + ".zps" not in tensors
        # The codes: the naive rounding of the float32 quotient by the scale in use.
        assert same_bits(stored.view(np.uint8).reshape(-1), naive_codes(x, repeat(s_use, x.shape, group), dtype))
        word = {"mx": f"mx-{rule}", "nvfp4": "nvfp4", "float32": ""}[scales]
        assert word in rows[name]["scheme_text"] and rows[name]["scheme"]["scale_dtype"] == SCALE_DTYPE[scales]
    # gpuq dequantize: the source dtypes back, bit for bit gpuq.dequantize and the naive product.
    back_path = tmp_path / f"d.{fmt}"
    assert run("dequantize", out, "-o", back_path, "--device", "cpu", "-q") == 0, capsys.readouterr().err
    back, back_meta, _ = read(back_path)
    assert back_meta is None and set(back) == set(src)
    assert same_bits(back["m.norm"], src["m.norm"])
    for name in ("m.a.weight", "m.b.weight"):
        x = src[name]
        st = tensors[name + ".scales"]
        if scales == "mx":
            s, extra = gpuq.e8m0_scales(st), {}
        elif scales == "nvfp4":
            s, extra = st.view(ml_dtypes.float8_e4m3fn).astype(np.float32), {
                "global_scale": tensors[name + ".global_scale"][0]}
        else:
            s, extra = st, {}
        q = (gpuq.Codes(tensors[name], x.shape, dtype) if dtype == "float4_e2m1fn"
             else tensors[name].view(np.uint8).view(ELEMENT[dtype]))
        want = gpuq.dequantize(q, s, axis=-1, group_size=group, dtype=x.dtype, **extra)
        assert same_bits(back[name], np.asarray(want)), name
        s_use = (s / np.float32(extra["global_scale"])).astype(np.float32) if extra else s
        naive = (decode(tensors[name], dtype, x.shape) * repeat(s_use, x.shape, group)).astype(np.float32)
        assert same_bits(back[name], naive.astype(x.dtype)), name


def test_all_zero_tensor_and_odd_single_row(tmp_path, capsys):
    """An all-zero tensor: MX byte 0x00 (2**-127), NVFP4 global scale 1.0 and block scale 0.125;
    a 1 x 1025 row (odd count: the padding nibble is 0); both read back to zeros and the row's values."""
    rng = np.random.default_rng(3)
    t = {"z": np.zeros((4, 40), np.float32), "r": rng.standard_normal((1, 1025)).astype(np.float32)}
    st_write(tmp_path / "s.safetensors", t, {"format": "pt"})
    for flags in (["--scales", "mx"], ["--scales", "nvfp4"]):
        out = tmp_path / f"q{flags[1]}.safetensors"
        assert run("quantize", tmp_path / "s.safetensors", "-o", out, "--dtype", "float4_e2m1fn", "--min-size",
                   "1", "--device", "cpu", "-q", *flags) == 0
        q, meta, _ = read(out)
        assert q["r"].shape == (513,) and q["r"][-1] >> 4 == 0
        assert not q["z"].any()
        if flags[1] == "mx":
            assert not q["z.scales"].any()
        else:
            assert q["z.global_scale"].tolist() == [1.0]
            assert np.all(q["z.scales"].astype(np.float32) == 0.125)
        assert run("dequantize", out, "-o", tmp_path / "d.safetensors", "--device", "cpu", "-q") == 0
        back, _, _ = read(tmp_path / "d.safetensors")
        assert not back["z"].any() and back["z"].dtype == np.float32
        s, extra = ((gpuq.e8m0_scales(q["r.scales"]), {}) if flags[1] == "mx" else
                    (q["r.scales"].astype(np.float32), {"global_scale": q["r.global_scale"][0]}))
        want = gpuq.dequantize(gpuq.Codes(q["r"], (1, 1025), "float4_e2m1fn"), s, axis=-1,
                               group_size=32 if flags[1] == "mx" else 16, **extra)
        assert same_bits(back["r"], np.asarray(want))


def test_older_reader_refuses_version_5(tmp_path, capsys, monkeypatch):
    """A gpuq that reads versions 1-4 (as the one before this) refuses the file in one line."""
    from gpuq.checkpoints import quantized

    _, out, _ = quantize_source(tmp_path, "safetensors", ["--dtype", "float4_e2m1fn"], capsys)
    monkeypatch.setattr(quantized, "KNOWN_VERSIONS", (1, 2, 3, 4))
    assert run("dequantize", out, "-o", tmp_path / "d.safetensors", "--device", "cpu") == 2
    err = capsys.readouterr().err
    assert ("written in gpuq file format version 5, newer than this gpuq reads (version 4); upgrade gpuq "
            "to dequantize it") in err
    assert not (tmp_path / "d.safetensors").exists()


def _edit_tensor(name, fn):
    def edit(t, m):
        t[name] = fn(t[name].copy())
    return edit


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case,flags,edit,message", [
    ("version 4", ["--dtype", "float4_e2m1fn"], {"format_version": 4},
     "dtype 'float4_e2m1fn' needs format version 5, but the file says version 4"),
    ("fp8 mx in version 4", ["--dtype", "float8_e4m3fn", "--scales", "mx"], {"format_version": 4},
     "scale_dtype 'float8_e8m0fnu' needs format version 5, but the file says version 4"),
    ("unknown rule", ["--dtype", "float6_e2m3fn"], {"scale_rule": "round"},
     "scale_rule 'round' is not one of floor, even, ceil, rceil (MX scales)"),
    ("nvfp4 on fp6", ["--dtype", "float6_e3m2fn"], {"scale_dtype": "float8_e4m3fn", "scale_rule": None},
     "scale_dtype 'float8_e4m3fn' (NVFP4) goes with float4_e2m1fn codes, got float6_e3m2fn"),
    ("rule on nvfp4", ["--dtype", "float4_e2m1fn", "--scales", "nvfp4"], {"scale_rule": "even"},
     "scale_rule 'even' with scale_dtype 'float8_e4m3fn': only MX scales have a rule"),
    ("unknown scale dtype", ["--dtype", "float4_e2m1fn"], {"scale_dtype": "float16"},
     "scale_dtype 'float16' is not one of float32, float8_e8m0fnu, float8_e4m3fn"),
    ("float32 said of e8m0 bytes", ["--dtype", "float4_e2m1fn"], {"scale_dtype": "float32", "scale_rule": None},
     "its scales 'w.scales' are uint8, but the gpuq metadata says float4_e2m1fn"),
    ("mx said of nvfp4", ["--dtype", "float4_e2m1fn", "--scales", "nvfp4"],
     {"scale_dtype": "float8_e8m0fnu", "scale_rule": "even"}, "but the gpuq metadata says float4_e2m1fn"),
])
def test_damaged_version_5_is_refused(tmp_path, capsys, fmt, case, flags, edit, message):
    base = _one_tensor_file(tmp_path, fmt, flags)
    refused_after_edit(tmp_path, capsys, fmt, base, "w", edit, message)


def _one_tensor_file(tmp_path, fmt, flags):
    rng = np.random.default_rng(5)
    src = tmp_path / f"one.{fmt}"
    write_checkpoint(str(src), fmt, {"w": rng.standard_normal((9, 45)).astype(np.float32)}, None)
    out = tmp_path / f"base.{fmt}"
    assert run("quantize", src, "-o", out, "--min-size", "1", "--device", "cpu", "-q", *flags) == 0
    return read(out)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("flags,entry,fn,message", [
    (["--dtype", "float6_e2m3fn"], "w", lambda a: _set_first(a, 0x40),
     "its float6_e2m3fn codes hold a byte 0x40, beyond the 6-bit codes"),
    (["--dtype", "float4_e2m1fn"], "w.scales", lambda a: _set_first(a, 0xFF),
     "scales must be finite"),
    (["--dtype", "float4_e2m1fn", "--scales", "nvfp4"], "w.global_scale", lambda a: a * np.float32(np.inf),
     "global_scale must be finite and > 0"),
    (["--dtype", "float4_e2m1fn"], "w", lambda a: _set_last(a, 0xF3),
     "the high nibble of its last byte pads an odd count of float4_e2m1fn codes (405)"),
])
def test_damaged_values_are_refused(tmp_path, capsys, fmt, flags, entry, fn, message):
    tensors, meta, extra = _one_tensor_file(tmp_path, fmt, flags)
    tensors[entry] = fn(tensors[entry].copy())
    bad = tmp_path / f"bad.{fmt}"
    write(bad, tensors, meta, extra)
    capsys.readouterr()
    assert run("dequantize", bad, "-o", tmp_path / f"out.{fmt}", "--device", "cpu") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / f"out.{fmt}").exists()


def _set_first(a, v):
    a.view(np.uint8).reshape(-1)[0] = v
    return a


def _set_last(a, v):
    a.view(np.uint8).reshape(-1)[-1] = v
    return a


def test_missing_global_scale_is_refused(tmp_path, capsys):
    tensors, meta, extra = _one_tensor_file(tmp_path, "safetensors", ["--dtype", "float4_e2m1fn", "--scales",
                                                                      "nvfp4"])
    del tensors["w.global_scale"]
    write(tmp_path / "bad.safetensors", tensors, meta, extra)
    assert run("dequantize", tmp_path / "bad.safetensors", "-o", tmp_path / "o.safetensors", "--device",
               "cpu") == 2
    assert "its global scale 'w.global_scale' are missing" in capsys.readouterr().err


def test_compare_specs_name_fp4_fp6(tmp_path, capsys):
    """``gpuq compare`` with fp4/fp6 specs gives quantize's SQNR and the stored bytes."""
    src = tmp_path / "src.safetensors"
    st_write(src, source_tensors("safetensors"), {"format": "pt"})
    specs = {"float4_e2m1fn": [], "float4_e2m1fn:nvfp4": ["--scales", "nvfp4"],
             "float6_e2m3fn:mx:ceil": ["--scale-rule", "ceil"]}
    args = [a for spec in specs for a in ("--scheme", spec)]
    assert run("compare", src, *args, "--min-size", "16", "--device", "cpu", "--json") == 0
    cmp = json.loads(capsys.readouterr().out)
    assert [s["text"] for s in cmp["schemes"]] == ["float4_e2m1fn mx-even axis=-1 g=32",
                                                   "float4_e2m1fn nvfp4 axis=-1 g=16",
                                                   "float6_e2m3fn mx-ceil axis=-1 g=32"]
    for k, (spec, flags) in enumerate(specs.items()):
        out = tmp_path / f"q{k}.safetensors"
        assert run("quantize", src, "-o", out, "--dtype", spec.split(":")[0], "--min-size", "16", "--device",
                   "cpu", "-q", "--json", *flags) == 0
        report = json.loads(capsys.readouterr().out)
        assert cmp["total"]["sqnr_db"][k] == report["total"]["sqnr_db"]
        tensors, meta, _ = read(out)
        stored = sum(tensors[n].nbytes for n in tensors if n.split(".scales")[0].split(".global_scale")[0]
                     in meta["tensors"])
        assert cmp["total"]["bytes_after"][k] == stored
    assert run("compare", src, "--scheme", "float4_e2m1fn:mx:nvfp4", "--device", "cpu") == 2
    assert "'nvfp4' is the second scales option" in capsys.readouterr().err


def test_sharded_nvfp4_lists_the_global_scales(tmp_path, capsys):
    """A sharded IN: each output shard holds its tensors' global scales, the index lists them,
    and the dequantized folder drops them."""
    rng = np.random.default_rng(2)
    folder = tmp_path / "in"
    folder.mkdir()
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for i in range(2):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        write_checkpoint(str(folder / shard), "safetensors", {f"l{i}.weight": rng.standard_normal((4, 48))
                                                              .astype(np.float32)}, None, {"format": "pt"})
        index["weight_map"][f"l{i}.weight"] = shard
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert run("quantize", folder, "-o", tmp_path / "q", "--dtype", "float4_e2m1fn", "--scales", "nvfp4",
               "--min-size", "16", "--device", "cpu", "-q") == 0
    wm = json.loads((tmp_path / "q" / "model.safetensors.index.json").read_text())["weight_map"]
    assert wm["l1.weight.global_scale"] == "model-00002-of-00002.safetensors"
    assert run("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--device", "cpu", "-q") == 0
    wm = json.loads((tmp_path / "d" / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(wm) == ["l0.weight", "l1.weight"]


@pytest.mark.parametrize("flags", [["--dtype", "float4_e2m1fn"], ["--dtype", "float6_e3m2fn", "--scale-rule", "ceil"],
                                   ["--dtype", "float4_e2m1fn", "--scales", "nvfp4"]])
def test_device_cuda_writes_the_host_bytes(tmp_path, capsys, flags):
    """--device cuda (a GPU, or the CPU execution of the kernels: tests/cudasim) writes and reads
    back the same bytes as --device cpu: codes brought back packed (fp4) or as fp6 bits."""
    from conftest import _cuda_skip_reason

    reason = _cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    src = tmp_path / "src.safetensors"
    write_checkpoint(str(src), "safetensors", source_tensors("safetensors"), None)
    got = {}
    for device in ("cpu", "cuda"):
        q, d = tmp_path / f"q-{device}.safetensors", tmp_path / f"d-{device}.safetensors"
        assert run("quantize", src, "-o", q, "--min-size", "16", "--device", device, "-q", *flags) == 0, \
            capsys.readouterr().err
        assert run("dequantize", q, "-o", d, "--device", device, "-q") == 0, capsys.readouterr().err
        got[device] = (q.read_bytes(), d.read_bytes())
    assert got["cpu"] == got["cuda"]


V5 = Path(__file__).resolve().parent / "data" / "format_v5"
V5_VARIANTS = {"mxfp4": ["--dtype", "float4_e2m1fn"], "nvfp4": ["--dtype", "float4_e2m1fn", "--scales", "nvfp4"],
               "mxfp6_e3m2_ceil_g8": ["--dtype", "float6_e3m2fn", "--scale-rule", "ceil", "--group-size", "8"]}


def naive_v5(tensors, name, scheme):
    """float32 ``code * scale`` from a version-5 file's stored bytes (groups along the last dim)."""
    shape = tuple(scheme["shape"]) if "shape" in scheme else tensors[name].shape
    assert scheme["axis"] == len(shape) - 1
    codes = decode(tensors[name], scheme["dtype"], shape)
    st = tensors[name + ".scales"]
    if scheme["scale_dtype"] == "float8_e8m0fnu":
        s = np.ldexp(np.float32(1), st.astype(np.int32) - 127).astype(np.float32)
    elif scheme["scale_dtype"] == "float8_e4m3fn":
        s = (st.view(ml_dtypes.float8_e4m3fn).astype(np.float32) / tensors[name + ".global_scale"][0])
    else:
        s = st
    return (codes * repeat(s.astype(np.float32), shape, scheme["group_size"])).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", list(V5_VARIANTS))
def test_version_5_fixture_reads_and_writes_the_same(tmp_path, capsys, fmt, variant):
    q, meta, _ = read(V5 / f"{variant}.{fmt}")
    assert meta["format_version"] == 5
    old_f32, _, _ = read(V5 / f"{variant}.f32.{fmt}")
    source, _, _ = read(V5 / f"source.{fmt}")
    out = tmp_path / f"out.{fmt}"
    assert run("dequantize", V5 / f"{variant}.{fmt}", "-o", out, "--dtype", "float32", "--device", "cpu",
               "-q") == 0, capsys.readouterr().err
    back, _, _ = read(out)
    assert set(back) == set(source)
    for name, scheme in meta["tensors"].items():
        want = naive_v5(q, name, scheme)
        assert same_bits(back[name], want) and same_bits(old_f32[name], want), name
    for name in set(source) - set(meta["tensors"]):
        assert same_bits(back[name], source[name])
    again = tmp_path / f"again.{fmt}"
    assert run("quantize", V5 / f"source.{fmt}", "-o", again, "--min-size", "64", "--device", "cpu", "-q",
               *V5_VARIANTS[variant]) == 0
    assert again.read_bytes() == (V5 / f"{variant}.{fmt}").read_bytes()


def test_compare_refuses_the_mse_search_of_mx_columns(tmp_path, capsys):
    """--calibrate mse has no MX/NVFP4 column: refused before IN is read (IN does not exist)."""
    assert run("compare", tmp_path / "missing.safetensors", "--scheme", "int4", "--scheme",
               "float4_e2m1fn:nvfp4", "--calibrate", "minmax", "--calibrate", "mse", "--device", "cpu") == 2
    err = capsys.readouterr().err
    assert "--scheme 'float4_e2m1fn:nvfp4' with --calibrate mse: MX and NVFP4 scales come from each" in err


@pytest.mark.parametrize("scales", ["mx", "nvfp4"])
def test_nan_and_inf_follow_the_contract(tmp_path, capsys, scales):
    """--nonfinite warn: the scales (and NVFP4's global scale) come from the finite values, NaN
    gives the +0 code and +-Inf +-max (0x7 / 0xF for fp4); the warning says so."""
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    x[0, 1], x[0, 2], x[1, 5] = np.nan, np.inf, -np.inf
    write_checkpoint(str(tmp_path / "s.safetensors"), "safetensors", {"w": x}, None)
    assert run("quantize", tmp_path / "s.safetensors", "-o", tmp_path / "q.safetensors", "--dtype",
               "float4_e2m1fn", "--scales", scales, "--min-size", "1", "--device", "cpu", "-q") == 0
    err = capsys.readouterr().err
    assert "1 NaN" in err and "(NaN -> 0, +-Inf -> +-max)" in err
    t, meta, _ = read(tmp_path / "q.safetensors")
    codes = unpack_nibbles(t["w"], 64, False).reshape(2, 32)
    assert (codes[0, 1], codes[0, 2], codes[1, 5]) == (0x0, 0x7, 0xF)
    finite = np.where(np.isfinite(x), x, np.float32(0))
    if scales == "nvfp4":
        assert t["w.global_scale"][0] == gpuq.global_scale(finite)
    s, _ = gpuq.choose_qparams(finite, axis=-1, group_size=32 if scales == "mx" else 16, dtype="float4_e2m1fn",
                               **({"scale_dtype": "float8_e8m0fnu"} if scales == "mx" else
                                  {"scale_dtype": "float8_e4m3fn", "global_scale": gpuq.global_scale(finite)}))
    stored = gpuq.e8m0_scales(t["w.scales"]) if scales == "mx" else t["w.scales"].astype(np.float32)
    assert same_bits(stored, np.asarray(s))


def test_inspect_names_the_global_scale_a_parameter(tmp_path, capsys):
    from gpuq.checkpoints import inspect

    _one_tensor_file(tmp_path, "safetensors", ["--dtype", "float4_e2m1fn", "--scales", "nvfp4"])
    roles = {t["name"]: t["role"] for t in inspect(tmp_path / "base.safetensors")["tensors"]}
    assert roles == {"w": "quantized", "w.scales": "parameter", "w.global_scale": "parameter"}
