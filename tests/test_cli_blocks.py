"""``gpuq quantize --block AxB`` and the file format version 4 that records it (issue 28).

``--block AxB`` gives every selected tensor one scale per ``A x B`` block of its last two
dimensions, blocks of 1 on the leading ones (an expert of ``[experts, out, in]`` never shares
a block), the last blocks ragged. Checked here: the recorded ``block_size`` and version (4
only in a file with a block scheme), the codes and parameters bit for bit
:func:`gpuq.quantize` / :func:`gpuq.choose_qparams` with that ``block_size``, ``gpuq
dequantize`` against a naive dequantization of the stored bytes (``scales[i // A, j // B]``,
stated in ``test_cli_formats.broadcast``), the report's scheme column, what is refused on the
command line and in damaged files, and ``tests/data/format_v4/`` (written by the first
version-4 gpuq), which must read the same forever.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import gpuq
from gpuq import cli

ml_dtypes = pytest.importorskip("ml_dtypes")
from test_cli_formats import (FORMATS, api_codes_bytes, fixture_reads_the_same,  # noqa: E402
                              naive_dequantize, quantized_file, read, refused_after_edit, same_bits,
                              st_write)

HERE = Path(__file__).resolve().parent
V4 = HERE / "data" / "format_v4"


def run(*args):
    return cli.main([str(a) for a in args])


def write_source(path, fmt, seed=28):
    """A rank-2 weight ragged in both dims for 16x32 blocks (37 = 2*16 + 5, 70 = 2*32 + 6), an
    MoE-like rank-3 weight whose experts differ by 10**3 in size, one block wider than its
    dims (9 < 16), a kept rank-1 tensor."""
    rng = np.random.default_rng(seed)
    experts = rng.standard_normal((3, 9, 40)) * np.array([0.01, 1, 10]).reshape(3, 1, 1)
    t = {"model.dense.weight": (rng.standard_normal((37, 70)) * 0.05).astype(
             ml_dtypes.bfloat16 if fmt == "safetensors" else np.float64),
         "model.experts.weight": experts.astype(np.float32),
         "model.norm": rng.standard_normal(50).astype(np.float32)}
    if fmt == "safetensors":
        st_write(path, t, {"format": "pt"})
    else:
        np.savez(path, **t)
    return t


BLOCKED = ["model.dense.weight", "model.experts.weight"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype,flags", [
    ("int8", []), ("uint8", ["--symmetric"]), ("int4", []), ("uint4", []),
    ("float8_e4m3fn", []), ("float8_e5m2", [])])
def test_block_round_trip_matches_the_api(tmp_path, capsys, fmt, dtype, flags):
    src = tmp_path / f"src.{fmt}"
    source = write_source(src, fmt)
    out = tmp_path / f"q.{fmt}"
    assert run("quantize", src, "-o", out, "--block", "16x32", "--dtype", dtype, "--min-size",
               "64", "--device", "cpu", "-q", "--json", *flags) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    tensors, meta, _ = read(out)
    assert meta["format_version"] == 4 and sorted(meta["tensors"]) == BLOCKED
    fp8 = dtype.startswith("float8")
    symmetric = bool(flags) or fp8
    rows = {r["name"]: r for r in report["tensors"]}
    for name in BLOCKED:
        x, s = source[name], meta["tensors"][name]
        block = (16, 32) if x.ndim == 2 else (1, 16, 32)
        assert s["block_size"] == list(block) and s["axis"] is None and s["group_size"] is None
        assert s["symmetric"] == symmetric
        assert rows[name]["scheme"]["block_size"] == list(block)
        assert rows[name]["scheme_text"].endswith("block=" + "x".join(map(str, block)))
        scales, zps = gpuq.choose_qparams(x, block_size=block, dtype=dtype, symmetric=symmetric)
        want_shape = tuple(math.ceil(n / b) for n, b in zip(x.shape, block))
        assert np.shape(scales) == want_shape
        assert same_bits(tensors[name + ".scales"], np.asarray(scales, np.float32))
        q = gpuq.quantize(x, scales, zps, block_size=block, dtype=dtype)
        assert tensors[name].tobytes() == api_codes_bytes(q), name
        if name + ".zps" in tensors:
            assert np.array_equal(tensors[name + ".zps"].astype(np.int64), zps)
        else:
            assert fp8 or (symmetric and dtype == "int4")
    assert same_bits(tensors["model.norm"], source["model.norm"])
    back = tmp_path / f"back.{fmt}"
    assert run("dequantize", out, "-o", back, "--dtype", "float32", "--device", "cpu", "-q") == 0
    got, gmeta, _ = read(back)
    assert gmeta is None and set(got) == set(source)
    for name in BLOCKED:
        assert same_bits(got[name], naive_dequantize(tensors, name, meta["tensors"][name], fmt))


def test_block_minus_one_takes_the_whole_dimension(tmp_path, capsys):
    """``--block=-1x32`` (issue 35): -1 is the whole dimension, as the API's block_size takes it;
    the codes and scales are those of the explicit whole-dimension block, the file records -1."""
    src, out, back = tmp_path / "src.npz", tmp_path / "q.npz", tmp_path / "back.npz"
    source = write_source(src, "npz")
    assert run("quantize", src, "-o", out, "--block=-1x32", "--min-size", "64", "--device", "cpu", "-q") == 0
    tensors, meta, _ = read(out)
    assert meta["tensors"]["model.dense.weight"]["block_size"] == [-1, 32]
    assert meta["tensors"]["model.experts.weight"]["block_size"] == [1, -1, 32]
    assert run("dequantize", out, "-o", back, "--device", "cpu", "-q") == 0
    got = read(back)[0]
    for name in BLOCKED:
        x = source[name]
        whole = (1,) * (x.ndim - 2) + (x.shape[-2], 32)
        scales, zps = gpuq.choose_qparams(x, block_size=whole, dtype="int8")
        assert tensors[name + ".scales"].shape == (*x.shape[:-2], 1, math.ceil(x.shape[-1] / 32))
        assert same_bits(tensors[name + ".scales"], np.asarray(scales, np.float32))
        q = gpuq.quantize(x, scales, zps, block_size=whole, dtype="int8")
        assert tensors[name].tobytes() == api_codes_bytes(q), name
        assert same_bits(got[name], gpuq.dequantize(q, scales, zps, block_size=whole, dtype=x.dtype))


def test_block_128x128_fp8_is_the_deepseek_layout(tmp_path, capsys):
    """e4m3 with scale = amax / 448 per 128x128 block, ``weight_scale_inv`` of shape
    ``[ceil(out/128), ceil(in/128)]``; ragged (300 x 260) and a rank-3 expert tensor."""
    rng = np.random.default_rng(7)
    t = {"w": (rng.standard_normal((300, 260)) * 0.02).astype(np.float32),
         "e": (rng.standard_normal((2, 130, 129))).astype(np.float32)}
    src, out = tmp_path / "src.safetensors", tmp_path / "q.safetensors"
    st_write(src, t, {})
    assert run("quantize", src, "-o", out, "--block", "128x128", "--dtype", "float8_e4m3fn",
               "--device", "cpu", "-q") == 0
    tensors, meta, _ = read(out)
    for name, grid in (("w", (3, 3)), ("e", (2, 2, 2))):
        x = t[name]
        scales = tensors[name + ".scales"]
        assert scales.shape == grid
        amax = np.zeros(grid, np.float32)
        for idx in np.ndindex(*grid):
            blk = tuple(slice(i * b, (i + 1) * b)
                        for i, b in zip(idx, (128, 128) if x.ndim == 2 else (1, 128, 128)))
            amax[idx] = np.abs(x[blk]).max()
        assert same_bits(scales, amax / np.float32(448))
        codes = tensors[name].view(ml_dtypes.float8_e4m3fn)
        assert np.abs(codes.astype(np.float32)).max() == 448  # each block's amax hits 448


def test_files_without_blocks_keep_their_version(tmp_path, capsys):
    """Only a file holding a block scheme is version 4 (int8 per-channel stays version 1)."""
    src = tmp_path / "src.safetensors"
    write_source(src, "safetensors")
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--axis", "0", "--min-size", "64",
               "--include", "model.dense.*", "--device", "cpu", "-q") == 0
    assert read(out)[1]["format_version"] == 1


@pytest.mark.parametrize("flags,message", [
    (["--block", "128x128", "--group-size", "64"],
     "--block and --group-size both say which elements share a scale; give one"),
    (["--block", "128"], "--block must be AxB, two positive integers or -1 for a whole dimension (e.g. "
                          "128x128, -1x128), got '128'"),
    (["--block", "\u00b2x4"], "--block must be AxB, two positive integers or -1 for a whole dimension (e.g. "
                               "128x128, -1x128), got '\u00b2x4'"),
    (["--block", "\uff14x4"], "--block must be AxB, two positive integers"),
    (["--block", "0x4"], "got '0x4'"),
    (["--block", "2x3x4"], "got '2x3x4'"),
    (["--block=-2x4"], "got '-2x4'"),
    (["--block", "4x2147483649"], "--block 4x2147483649: a block size is at most 2**31 (2147483648); -1 takes a "
                                  "whole dimension"),
    (["--block", "12345678901234567890x4"], "a block size is at most 2**31"),
])
def test_bad_block_flags_are_refused(tmp_path, capsys, flags, message):
    src = tmp_path / "src.npz"
    write_source(src, "npz")
    out = tmp_path / "q.npz"
    assert run("quantize", src, "-o", out, "--device", "cpu", *flags) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()


@pytest.mark.parametrize("other", [["--axis", "0"], ["--per-tensor"]])
def test_block_excludes_the_other_schemes(tmp_path, capsys, other):
    src = tmp_path / "src.npz"
    write_source(src, "npz")
    assert run("quantize", src, "-o", tmp_path / "q.npz", "--block", "8x8", *other) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "q.npz").exists()


# -- damaged version-4 files ------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("edit,message", [
    ({"format_version": 3}, "block_size [16, 32] needs format version 4, but the file says "
                            "version 3"),
    ({"format_version": 6}, "newer than this gpuq reads (version 5)"),
    ({"axis": 0}, "block_size [1, 16, 32] with axis 0 / group_size None: a block shape says "
                  "it alone"),
    ({"group_size": 8}, "is not null or an integer >= 1 with an axis"),
    ({"block_size": [16, 32]}, "the gpuq metadata says block_size [16, 32], one entry per dim, "
                               "but the codes have shape [3, 9, 40]"),
    ({"block_size": [1, 0, 32]}, "block_size [1, 0, 32] is not a list of integers >= 1"),
    ({"block_size": 16}, "block_size 16 is not a list of integers >= 1"),
    ({"block_size": [1, 8, 32]}, "its scales 'model.experts.weight.scales' have shape [3, 1, 2], "
                                 "but int8 asymmetric blocks [1, 8, 32] of shape [3, 9, 40] "
                                 "needs [3, 2, 2]"),
])
def test_damaged_version_4_is_refused(tmp_path, capsys, fmt, edit, message):
    base = quantized_file(tmp_path, fmt, write_source, "--block", "16x32", "--min-size", "64")
    assert base[1]["format_version"] == 4
    refused_after_edit(tmp_path, capsys, fmt, base, "model.experts.weight", edit, message)


# -- the version-4 fixture --------------------------------------------------------------------

V4_VARIANTS = {"block_asym_int8": ["--block", "4x8"],
               "block_asym_uint4": ["--block", "4x8", "--dtype", "uint4"],
               "block_e4m3fn": ["--block", "8x16", "--dtype", "float8_e4m3fn"]}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", sorted(V4_VARIANTS))
def test_version_4_fixture_reads_the_same(tmp_path, capsys, variant, fmt):
    meta = fixture_reads_the_same(V4, variant, fmt, 4, tmp_path, capsys)
    a, b = V4_VARIANTS[variant][1].split("x")
    assert all(s["block_size"][-2:] == [int(a), int(b)] for s in meta["tensors"].values())


def test_fixture_v4_matches_todays_writer(tmp_path, capsys):
    """Today's quantize writes the fixture's bytes (a change of layout must be a new version)."""
    for variant, flags in V4_VARIANTS.items():
        for fmt in FORMATS:
            out = tmp_path / f"{variant}.{fmt}"
            assert run("quantize", V4 / f"source.{fmt}", "-o", out, "--min-size", "64",
                       "--device", "cpu", "-q", *flags) == 0
            assert out.read_bytes() == (V4 / out.name).read_bytes(), (variant, fmt)


def test_compare_block_scheme_matches_quantize(tmp_path, capsys):
    """``gpuq compare --scheme DTYPE:bAxB`` reports the SQNR and bytes ``--block AxB`` gives."""
    src = tmp_path / "src.safetensors"
    write_source(src, "safetensors")
    assert run("compare", src, "--scheme", "float8_e4m3fn:b16x32", "--scheme", "int4:b16x32",
               "--min-size", "64", "--device", "cpu", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["text"] for s in report["schemes"]] == [
        "float8_e4m3fn block=16x32 | block=1x16x32", "int4 asym block=16x32 | block=1x16x32"]
    for k, dtype in enumerate(("float8_e4m3fn", "int4")):
        out = tmp_path / f"q{k}.safetensors"
        assert run("quantize", src, "-o", out, "--block", "16x32", "--dtype", dtype,
                   "--min-size", "64", "--device", "cpu", "-q", "--json") == 0
        q = json.loads(capsys.readouterr().out)
        assert {r["name"]: r["sqnr_db"][k] for r in report["tensors"]} == {
            r["name"]: r["sqnr_db"] for r in q["tensors"] if r["quantized"]}
