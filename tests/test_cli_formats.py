"""The CLI with the code types of issue 19: int4/uint4 (packed) and fp8 (e4m3fn, e5m2).

What is promised (gpuq/checkpoints/quantized.py has the layout):

* ``gpuq quantize --dtype int4|uint4|float8_e4m3fn|float8_e5m2`` writes format
  version 2: the codes are bit for bit what :func:`gpuq.quantize` gives with
  :func:`gpuq.choose_qparams`' parameters on the same tensor (packed bytes for
  int4, F8_E4M3/F8_E5M2 in .safetensors, the uint8 bits in .npz), and
  ``gpuq dequantize`` gives back what a naive dequantization of the stored bytes
  gives (nibbles unpacked by NumPy here, fp8 widened by ml_dtypes; not gpuq).
* int8/uint8 output stays version 1 (older gpuq read it); version 1 files
  still read, and relabelled version 2 they read the same.
* Sharded checkpoints: each output shard is the one-file run's bytes.
* A damaged version-2 file is refused: one line, exit 2, no output file.
* ``tests/data/format_v2/`` (written by the first version-2 gpuq) reads the same forever.
* ``gpuq compare`` prints the SQNR the quantize reports give.

Every safetensors file here is read (and, for the damaged ones, written) by the
small raw reader/writer below: safetensors' NumPy loader (0.8) has no fp8 type.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import gpuq
from gpuq import cli
from report_rows import assert_same_rows

ml_dtypes = pytest.importorskip("ml_dtypes")

HERE = Path(__file__).resolve().parent
V1 = HERE / "data" / "format_v1"
V2 = HERE / "data" / "format_v2"
FORMATS = ["safetensors", "npz"]
NEW = ["int4", "uint4", "float8_e4m3fn", "float8_e5m2"]
FP8 = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
ST_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
             "I32": np.int32, "U32": np.uint32, "I64": np.int64, "U64": np.uint64,
             "F16": np.float16, "F32": np.float32, "F64": np.float64,
             "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
             "F8_E5M2": ml_dtypes.float8_e5m2}
ST_CODES = {np.dtype(v): k for k, v in ST_DTYPES.items()}


# -- raw file access (not gpuq) -----------------------------------------------------------

def st_read(path):
    """(tensors, metadata) of a .safetensors file, parsed by hand."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], ST_DTYPES[info["dtype"]]).reshape(info["shape"]).copy()
    return out, meta


def st_write(path, tensors, metadata):
    """A .safetensors file by hand (names sorted, no alignment games: valid all the same)."""
    header, blobs, at = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        header[name] = {"dtype": ST_CODES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read(path):
    """(tensors, gpuq meta or None, other metadata) of a .safetensors or .npz file."""
    if str(path).endswith(".safetensors"):
        tensors, meta = st_read(path)
        gq = meta.pop("gpuq", None)
        return tensors, None if gq is None else json.loads(gq), meta
    with np.load(path, allow_pickle=False) as z:
        tensors = {k: z[k] for k in z.files}
    gq = tensors.pop("__gpuq__", None)
    return tensors, None if gq is None else json.loads(str(gq)), {}


def write(path, tensors, meta, extra=None):
    text = json.dumps(meta)
    if str(path).endswith(".safetensors"):
        st_write(path, tensors, {**(extra or {}), "gpuq": text})
    else:
        np.savez(path, __gpuq__=np.array(text), **tensors)


# -- the oracle ----------------------------------------------------------------------------

def unpack_nibbles(data, n, signed):
    """ONNX's order: element 2k in the low nibble of byte k, 2k+1 in the high one."""
    nib = np.empty(2 * data.size, np.int64)
    nib[0::2] = data & 0x0F
    nib[1::2] = data >> 4
    nib = nib[:n]
    return np.where(nib >= 8, nib - 16, nib) if signed else nib


def broadcast(p, shape, scheme):
    axis, g = scheme["axis"], scheme["group_size"]
    p = np.asarray(p)
    if scheme.get("block_size") is not None:  # version 4: p[i_0 // b_0, ..., i_r // b_r]
        for d, (n, b) in enumerate(zip(shape, scheme["block_size"])):
            b = n if b == -1 else b
            p = np.repeat(p, b, axis=d).take(np.arange(n), axis=d)
        return p
    if axis is None:
        return p.reshape(())
    if isinstance(axis, list):  # several axes: p is the shape projected onto them
        return p.reshape([d if i in axis else 1 for i, d in enumerate(shape)])
    if g is None:
        view = [1] * len(shape)
        view[axis] = -1
        return p.reshape(view)
    return np.repeat(p, g, axis=axis).take(np.arange(shape[axis]), axis=axis)


def naive_dequantize(tensors, name, scheme, fmt, out=np.float32):
    """``(q - zp) * s`` from the stored bytes (fp8: ml_dtypes' exact widening * s), multiplied
    in float32, or in float64 for a float64 ``out``."""
    work = np.float64 if np.dtype(out) == np.float64 else np.float32
    dtype, q = scheme["dtype"], tensors[name]
    if dtype in ("int4", "uint4"):
        shape = tuple(scheme["shape"])
        assert q.dtype == np.uint8 and q.shape == ((math.prod(shape) + 1) // 2,)
        codes = unpack_nibbles(q, math.prod(shape), dtype == "int4").reshape(shape)
    elif dtype in FP8:
        shape = q.shape
        assert q.dtype == (np.dtype(FP8[dtype]) if fmt == "safetensors" else np.uint8)
        codes = q.view(FP8[dtype]).astype(np.float32)
    else:
        shape = q.shape
        codes = q.astype(np.int64)
    s = broadcast(tensors[name + ".scales"].astype(np.float32).astype(work), shape, scheme)
    zps = tensors.get(name + ".zps")
    if dtype in FP8:
        assert zps is None
        return (codes.astype(work) * s).astype(out)
    z = 0 if zps is None else broadcast(zps.astype(np.int64), shape, scheme)
    return ((codes - z).astype(work) * s).astype(out)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def api_codes_bytes(q):
    """The bytes gpuq's API result holds: packed data, or the fp8/int8 array's bytes."""
    return np.asarray(q.data if isinstance(q, gpuq.Codes) else q).tobytes()


# -- sources -------------------------------------------------------------------------------

def source_tensors(fmt, seed=3):
    """Odd sizes (packed counts with a padding nibble), ragged groups, outliers, kept tensors."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((33, 31)) * 0.05
    w[::7, 3] *= 9
    t = {"model.a.weight": w.astype(ml_dtypes.bfloat16 if fmt == "safetensors" else np.float64),
         "model.b.weight": (rng.standard_normal((3, 5, 7)) * 2).astype(np.float16),
         "model.c.weight": (rng.standard_normal((64, 48)) * 0.01).astype(np.float32),
         "model.c.weight_zero_row": np.zeros((2, 40), np.float32),
         "model.norm": rng.standard_normal(31).astype(np.float32),
         "ids": np.arange(6, dtype=np.int64).reshape(2, 3)}
    return t


def make_source(tmp_path, fmt):
    path = tmp_path / f"src.{fmt}"
    t = source_tensors(fmt)
    if fmt == "safetensors":
        st_write(path, t, {"format": "pt"})
    else:
        np.savez(path, **t)
    return path, t


def run(*args):
    return cli.main([str(a) for a in args])


def default_for(dtype, ndim):
    """The defaults table (no --axis, --per-tensor, --group-size): ``(axis, group_size)``."""
    if dtype in ("int4", "uint4"):
        return ndim - 1, 128  # groups of 128 along the last dimension, at every rank
    return (0 if ndim == 2 else tuple(range(ndim - 1))), None  # one scale per row


SCHEMES = {  # name -> (flags, axis, group_size, symmetric); axis "default": the table
    "default": ([], "default", None, False),
    "pc": (["--axis", "0"], 0, None, False),
    "pc_sym": (["--symmetric", "--axis", "0"], 0, None, True),
    # the narrow rule (max|x| / qmax), the array API's default: 4-bit codes take it on request
    "pc_sym_narrow": (["--symmetric", "--axis", "0", "--scale-rule", "narrow"], 0, None, True),
    "g8": (["--group-size", "8"], -1, 8, False),
    "g5_axis0_sym": (["--group-size", "5", "--axis", "0", "--symmetric"], 0, 5, True),
    "tensor": (["--per-tensor"], None, None, False),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", NEW)
@pytest.mark.parametrize("scheme_name", list(SCHEMES))
def test_round_trip_matches_the_api_and_a_naive_dequantization(tmp_path, capsys, fmt, dtype,
                                                              scheme_name):
    flags, axis, group, sym = SCHEMES[scheme_name]
    src, source = make_source(tmp_path, fmt)
    out = tmp_path / f"q.{fmt}"
    if "--scale-rule" in flags and dtype in FP8:  # the integer codes' rules: fp8 refuses them
        assert run("quantize", src, "-o", out, "--dtype", dtype, "-q", *flags) == 2
        assert "--scale-rule narrow is for symmetric integer codes" in capsys.readouterr().err
        assert not out.exists()
        return
    assert run("quantize", src, "-o", out, "--dtype", dtype, "--min-size", "16",
               "--device", "cpu", "-q", "--json", *flags) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    tensors, meta, extra = read(out)
    # Version 3 only for a file holding a multi-axis tensor (model.b.weight is rank 3).
    multi = axis == "default" and dtype not in ("int4", "uint4")
    assert meta["format_version"] == (3 if multi else 2) and meta["source_format"] == fmt
    if fmt == "safetensors":
        assert extra == {"format": "pt"}
    quantized = sorted(meta["tensors"])
    assert quantized == ["model.a.weight", "model.b.weight", "model.c.weight",
                         "model.c.weight_zero_row"]
    fp8 = dtype in FP8
    rows = {r["name"]: r for r in report["tensors"]}
    for name in quantized:
        x = source[name]
        s = meta["tensors"][name]
        if axis == "default":
            k, group = default_for(dtype, x.ndim)
        else:
            k = None if axis is None else axis % x.ndim
        assert (s["dtype"], s["axis"], s["group_size"]) == (
            dtype, list(k) if isinstance(k, tuple) else k, group)
        assert s["symmetric"] == (sym or fp8) and s["source_dtype"] == x.dtype.name
        if dtype in ("int4", "uint4"):
            assert s["shape"] == list(x.shape) and s["packing"] == "onnx_nibbles"
        else:
            assert "shape" not in s and "packing" not in s
        # Bit for bit the API on the same tensor: symmetric 4-bit codes by the full-range rule
        # unless --scale-rule narrow says otherwise (the file does not record it).
        full = sym and dtype in ("int4", "uint4") and "narrow" not in flags
        assert "scale_rule" not in s
        assert rows[name]["scheme"].get("scale_rule") == ("full" if full else None)
        scales, zps = gpuq.choose_qparams(x, axis=k, group_size=group, dtype=dtype,
                                          symmetric=sym or fp8, scale_rule="full" if full else None)
        q = gpuq.quantize(x, scales, zps, axis=k, group_size=group, dtype=dtype)
        assert tensors[name].tobytes() == api_codes_bytes(q), name
        assert same_bits(tensors[name + ".scales"].reshape(np.shape(scales)),
                         np.asarray(scales, np.float32))
        has_zps = not fp8 and not (sym and dtype == "int4")
        assert (name + ".zps" in tensors) == has_zps
        if has_zps:
            z = tensors[name + ".zps"]
            assert z.dtype == (np.int8 if dtype == "int4" else np.uint8)
            assert np.array_equal(z.reshape(np.shape(zps)).astype(np.int64), zps)
        # The report's SQNR is that of the naive dequantization.
        want = naive_dequantize(tensors, name, s, fmt)
        x64 = x.astype(np.float64)
        err = float(((x64 - want.astype(np.float64)) ** 2).sum())
        sig = float((x64 ** 2).sum())
        got = rows[name]["sqnr_db"]
        if err == 0:
            assert got is None and rows[name]["sqnr_db_reason"].startswith("+Inf")
        else:
            assert got == pytest.approx(10 * math.log10(sig / err), abs=1e-9)
    for name in ("model.norm", "ids"):
        assert same_bits(tensors[name], source[name])
    # And back: bit for bit the naive dequantization, in float32 and in the source dtype.
    back = tmp_path / f"back.{fmt}"
    assert run("dequantize", out, "-o", back, "--dtype", "float32", "--device", "cpu", "-q") == 0
    got, gmeta, _ = read(back)
    assert gmeta is None and set(got) == set(source)
    for name in quantized:
        assert same_bits(got[name], naive_dequantize(tensors, name, meta["tensors"][name], fmt))
    native = tmp_path / f"native.{fmt}"
    assert run("dequantize", out, "-o", native, "--device", "cpu", "-q") == 0
    got, _, _ = read(native)
    for name in quantized:  # float64 comes back float64, multiplied in float64
        want = naive_dequantize(tensors, name, meta["tensors"][name], fmt, out=source[name].dtype)
        assert same_bits(got[name], want), name


def test_int8_output_stays_version_1(tmp_path, capsys):
    """int8/uint8 files with one axis per tensor are written as before (version 1, the same
    keys), so a gpuq from before version 2 still reads them; a multi-axis tensor (the default
    at rank 3) makes the file version 3, with the same keys."""
    src, _ = make_source(tmp_path, "safetensors")
    for dtype in ("int8", "uint8"):
        for flags, version in ((["--exclude", "model.b.weight"], 1), (["--axis", "0"], 1),
                               ([], 3)):
            out = tmp_path / f"{dtype}-{version}.safetensors"
            assert run("quantize", src, "-o", out, "--dtype", dtype, "--min-size", "16",
                       "--device", "cpu", "-q", *flags) == 0
            _, meta, _ = read(out)
            assert meta["format_version"] == version, flags
            for s in meta["tensors"].values():
                assert set(s) == {"dtype", "symmetric", "axis", "group_size", "source_dtype"}
            assert ([s["axis"] for s in meta["tensors"].values()] == [0, [0, 1], 0, 0]) == (
                version == 3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_version_1_relabelled_2_reads_the_same(tmp_path, capsys, fmt):
    """Version 2 is a superset of version 1."""
    tensors, meta, extra = read(V1 / f"group10_asym_int8.{fmt}")
    meta["format_version"] = 2
    src = tmp_path / f"v2.{fmt}"
    write(src, tensors, meta, extra)
    for path, name in ((V1 / f"group10_asym_int8.{fmt}", "a"), (src, "b")):
        assert run("dequantize", path, "-o", tmp_path / f"{name}.{fmt}", "--dtype", "float32",
                   "--device", "cpu", "-q") == 0, capsys.readouterr().err
    a, _, _ = read(tmp_path / f"a.{fmt}")
    b, _, _ = read(tmp_path / f"b.{fmt}")
    assert a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)


# -- the version-2 fixture -----------------------------------------------------------------

V2_VARIANTS = ["g16_asym_int4", "pc_sym_uint4", "g16_asym_uint4", "rows_e4m3fn", "tensor_e5m2"]


def fixture_reads_the_same(folder, variant, fmt, version, tmp_path, capsys) -> dict:
    """A fixture file of format ``version``: today's ``gpuq dequantize`` and the fixture's own
    ``.f32`` file both give the naive dequantization of its stored bytes, and every other
    tensor of its source comes back bit for bit. Returns the file's gpuq metadata."""
    q, meta, _ = read(folder / f"{variant}.{fmt}")
    assert meta["format_version"] == version
    old_f32, _, _ = read(folder / f"{variant}.f32.{fmt}")
    source, _, _ = read(folder / f"source.{fmt}")
    out = tmp_path / f"out.{fmt}"
    assert run("dequantize", folder / f"{variant}.{fmt}", "-o", out, "--dtype", "float32",
               "--device", "cpu", "-q") == 0, capsys.readouterr().err
    back, back_meta, _ = read(out)
    assert back_meta is None and set(back) == set(source)
    for name, scheme in meta["tensors"].items():
        want = naive_dequantize(q, name, scheme, fmt)
        assert same_bits(back[name], want), (variant, name)
        assert same_bits(old_f32[name], want), (variant, name)
    for name in set(source) - set(meta["tensors"]):
        assert same_bits(back[name], source[name])
    return meta


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", V2_VARIANTS)
def test_version_2_fixture_reads_the_same(tmp_path, capsys, variant, fmt):
    meta = fixture_reads_the_same(V2, variant, fmt, 2, tmp_path, capsys)
    assert sorted(meta["tensors"]) == ["model.layers.0.w", "model.layers.10.w",
                                       "model.layers.2.w"]


def test_fixture_v2_matches_todays_writer(tmp_path, capsys):
    """Today's quantize writes the fixture's bytes (a change of layout must be a new version)."""
    flags = {"g16_asym_int4": ["--dtype", "int4", "--group-size", "16"],
             "rows_e4m3fn": ["--dtype", "float8_e4m3fn", "--axis", "0"],  # the default then
             "tensor_e5m2": ["--dtype", "float8_e5m2", "--per-tensor"]}
    for variant, f in flags.items():
        for fmt in FORMATS:
            out = tmp_path / f"{variant}.{fmt}"
            assert run("quantize", V2 / f"source.{fmt}", "-o", out, "--min-size", "64",
                       "--device", "cpu", "-q", *f) == 0
            if fmt == "safetensors":
                assert out.read_bytes() == (V2 / out.name).read_bytes(), variant
            else:
                a, am, _ = read(out)
                b, bm, _ = read(V2 / out.name)
                assert am == bm and a.keys() == b.keys()
                assert all(same_bits(a[k], b[k]) for k in a), variant


# -- sharded ------------------------------------------------------------------------------

def test_sharded_int4_and_fp8(tmp_path, capsys):
    """Each output shard is byte for byte the one-file run on that shard; dequantize
    gives the naive values back."""
    rng = np.random.default_rng(5)
    folder = tmp_path / "in"
    folder.mkdir()
    weight_map = {}
    for i in range(2):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        t = {f"layers.{i}.w": (rng.standard_normal((40, 33)) * 0.1).astype(ml_dtypes.bfloat16),
             f"layers.{i}.bias": rng.standard_normal(40).astype(np.float32)}
        st_write(folder / shard, t, {"format": "pt"})
        weight_map.update({k: shard for k in t})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    for dtype, flags in (("int4", ["--group-size", "16"]), ("float8_e4m3fn", [])):
        out = tmp_path / f"out-{dtype}"
        assert run("quantize", folder, "-o", out, "--dtype", dtype, "--device", "cpu", "-q",
                   *flags) == 0, capsys.readouterr().err
        index = json.loads((out / "model.safetensors.index.json").read_text())
        for shard in sorted(set(weight_map.values())):
            one = tmp_path / f"one-{dtype}-{shard}"
            assert run("quantize", folder / shard, "-o", one, "--dtype", dtype, "--device",
                       "cpu", "-q", *flags) == 0
            assert (out / shard).read_bytes() == one.read_bytes()
            _, meta, _ = read(out / shard)
            assert meta["format_version"] == 2
        names = set(index["weight_map"])
        assert {"layers.0.w.scales", "layers.1.w.scales"} <= names
        assert ("layers.0.w.zps" in names) == (dtype == "int4")
        back = tmp_path / f"back-{dtype}"
        assert run("dequantize", out, "-o", back, "--dtype", "float32", "--device", "cpu",
                   "-q") == 0, capsys.readouterr().err
        for shard in sorted(set(weight_map.values())):
            q, meta, _ = read(out / shard)
            got, _, _ = read(back / shard)
            for name, scheme in meta["tensors"].items():
                assert same_bits(got[name], naive_dequantize(q, name, scheme, "safetensors"))


# -- damaged version-2 files ---------------------------------------------------------------

@pytest.fixture(scope="module")
def v2_bases(tmp_path_factory):
    """One quantized file per (code dtype, format), written by the CLI."""
    d = tmp_path_factory.mktemp("v2")
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((9, 13)) * 0.5).astype(np.float32)  # 117 codes: a padding nibble
    out = {}
    for fmt in FORMATS:
        src = d / f"src.{fmt}"
        if fmt == "safetensors":
            st_write(src, {"w": w, "b": w[0]}, {"format": "pt"})
        else:
            np.savez(src, w=w, b=w[0])
        for dtype in NEW:
            dst = d / f"{dtype}.{fmt}"
            assert cli.main(["quantize", str(src), "-o", str(dst), "--dtype", dtype,
                             "--group-size", "4", "--min-size", "1", "--device", "cpu",
                             "-q"]) == 0
            out[dtype, fmt] = dst
    return out


def _scheme(**kw):
    def edit(t, m):
        m["tensors"]["w"].update(kw)
    return edit


def _drop_key(key):
    def edit(t, m):
        del m["tensors"]["w"][key]
    return edit


def _set(key, fn):
    def edit(t, m):
        t[key] = fn(t[key])
    return edit


def _add_zps(t, m):
    t["w.zps"] = np.zeros(t["w.scales"].shape, np.int8)


def _version(v):
    def edit(t, m):
        m["format_version"] = v
    return edit


CORRUPT = [
    # (id, dtypes, edit, message)
    ("packed one byte short", ("int4", "uint4"), _set("w", lambda a: a[:-1]),
     "its packed codes 'w' have shape [58], but int4 codes of shape [9, 13] pack into 59 "
     "bytes"),
    ("packed one byte long", ("int4", "uint4"), _set("w", lambda a: np.append(a, np.uint8(0))),
     "pack into 59 bytes"),
    ("packed 2-D", ("int4",), _set("w", lambda a: np.append(a, np.uint8(0)).reshape(2, 30)),
     "its packed codes 'w' have shape [2, 30]"),
    ("packed as int8", ("int4",), _set("w", lambda a: a.view(np.int8)),
     "its codes 'w' are int8, but the gpuq metadata says int4 asymmetric axis 1, group size 4, "
     "which needs uint8 (packed bytes)"),
    ("shape disagrees", ("int4", "uint4"), _scheme(shape=[13, 10]),
     "pack into 65 bytes"),
    ("shape missing", ("int4",), _drop_key("shape"),
     "tensor 'w': missing keys 'shape' for int4 codes"),
    ("shape not sizes", ("uint4",), _scheme(shape=[9, -13]), "shape [9, -13] is not a list"),
    ("packing missing", ("int4",), _drop_key("packing"),
     "tensor 'w': missing keys 'packing' for int4 codes"),
    ("packing unknown", ("uint4",), _scheme(packing="high_first"),
     "packing 'high_first' is unknown"),
    ("shape on fp8", ("float8_e4m3fn",), _scheme(shape=[9, 13]),
     "tensor 'w': unknown keys 'shape' for float8_e4m3fn codes"),
    ("unknown dtype", NEW, _scheme(dtype="int2"),
     "dtype 'int2' is not one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2"),
    ("new dtype in version 1", NEW, _version(1), "needs format version 2, but the file says "
     "version 1"),
    ("version 6", NEW, _version(6), "format version 6, newer than this gpuq reads (version 5)"),
    ("block_size in version 3", NEW, lambda t, m: (_version(3)(t, m), m["tensors"]["w"].update(
        axis=None, group_size=None, block_size=[4, 4])),
     "block_size [4, 4] needs format version 4, but the file says version 3"),
    ("zps with fp8", ("float8_e4m3fn", "float8_e5m2"), _add_zps,
     "the file has 'w.zps', but the gpuq metadata says float8_e"),
    ("fp8 asymmetric", ("float8_e5m2",), _scheme(symmetric=False),
     "symmetric is false, but float8_e5m2 codes have no zero point"),
    ("fp8 as int8", ("float8_e4m3fn",), _set("w", lambda a: a.view(np.int8)),
     "its codes 'w' are int8, but the gpuq metadata says float8_e4m3fn axis 1, group size 4, "
     "which needs"),
    ("fp8 bits of the other fp8", ("float8_e4m3fn",), _scheme(dtype="float8_e5m2"),
     None),  # safetensors: F8_E4M3 is not F8_E5M2; npz: both are uint8 bits (reads: see below)
    ("int4 zps as uint8", ("int4",), _set("w.zps", lambda a: a.view(np.uint8)),
     "its zero points 'w.zps' are uint8, but the gpuq metadata says int4 asymmetric"),
    ("int4 zps out of range", ("int4",), _set("w.zps", lambda a: np.full_like(a, 8)),
     "its zero points 'w.zps' lie in [8, 8], outside the int4 range [-8, 7]"),
    ("uint4 zps out of range", ("uint4",), _set("w.zps", lambda a: np.full_like(a, 16)),
     "outside the uint4 range [0, 15]"),
    ("padding nibble", ("int4", "uint4"), _set("w", lambda a: np.append(a[:-1], a[-1] | 0x50)),
     "the high nibble of its last byte pads an odd count of"),
    ("scales missing", NEW, lambda t, m: t.pop("w.scales"), "its scales 'w.scales' are missing"),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_damaged_version_2_is_refused(tmp_path, capsys, v2_bases, case, fmt):
    _, dtypes, edit, message = case
    for dtype in dtypes:
        tensors, meta, extra = read(v2_bases[dtype, fmt])
        edit(tensors, meta)
        src = tmp_path / f"bad-{dtype}.{fmt}"
        write(src, tensors, meta, extra)
        before = sorted(os.listdir(tmp_path))
        code = run("dequantize", src, "-o", tmp_path / f"out.{fmt}", "--device", "cpu")
        err = capsys.readouterr().err.strip().splitlines()
        if message is None:  # the fp8 kind relabelled: an error in .safetensors only
            if fmt == "npz":
                assert code == 0
                os.unlink(tmp_path / f"out.{fmt}")
                continue
            message = "its codes 'w' are float8_e4m3fn, but the gpuq metadata says float8_e5m2"
        assert code == 2 and len(err) == 1, (dtype, err)
        assert err[0].startswith("gpuq: error: cannot read IN"), err[0]
        assert message.replace("int4 codes", f"{dtype} codes") in err[0], (dtype, err[0])
        assert sorted(os.listdir(tmp_path)) == before


def quantized_file(tmp_path, fmt, write_source, *options):
    """``read``'s triple of what ``gpuq quantize`` writes with ``options`` from the source that
    ``write_source(path, fmt)`` makes (a base for :func:`refused_after_edit`)."""
    src = tmp_path / f"src.{fmt}"
    write_source(src, fmt)
    out = tmp_path / f"base.{fmt}"
    assert run("quantize", src, "-o", out, *options, "--device", "cpu", "-q") == 0
    return read(out)


def refused_after_edit(tmp_path, capsys, fmt, base, name, edit, message):
    """A file ``base`` (``read``'s triple) with ``edit`` applied (``format_version`` to the file,
    every other key to tensor ``name``'s scheme) is refused by ``gpuq dequantize``: one line
    naming IN and ``message``, exit 2, no output."""
    tensors, meta, extra = base
    if "format_version" in edit:
        meta["format_version"] = edit["format_version"]
    else:
        meta["tensors"][name].update(edit)
    src = tmp_path / f"bad.{fmt}"
    write(src, tensors, meta, extra)
    capsys.readouterr()
    assert run("dequantize", src, "-o", tmp_path / f"out.{fmt}", "--device", "cpu") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuq: error: cannot read IN"), err
    assert message in err[0], err[0]
    assert not (tmp_path / f"out.{fmt}").exists()


def test_undamaged_bases_read(tmp_path, capsys, v2_bases):
    """The edit/rewrite path alone changes nothing (so the refusals above are the edits')."""
    for (dtype, fmt), path in v2_bases.items():
        tensors, meta, extra = read(path)
        src = tmp_path / f"same-{dtype}.{fmt}"
        write(src, tensors, meta, extra)
        assert run("dequantize", src, "-o", tmp_path / f"o-{dtype}.{fmt}", "--device", "cpu",
                   "-q") == 0, capsys.readouterr().err


# -- non-finite, and the comparison ---------------------------------------------------------

def test_fp8_nan_stays_nan_and_inf_saturates(tmp_path, capsys):
    w = (np.random.default_rng(2).standard_normal((8, 16))).astype(np.float32)
    w[1, 2], w[3, 4], w[5, 6] = np.nan, np.inf, -np.inf
    src = tmp_path / "src.npz"
    np.savez(src, w=w)
    out = tmp_path / "q.npz"
    assert run("quantize", src, "-o", out, "--dtype", "float8_e4m3fn", "--min-size", "1",
               "--device", "cpu", "-q", "--nonfinite", "warn") == 0
    err = capsys.readouterr().err
    assert "NaN -> NaN, +-Inf -> +-max finite" in err
    t, _, _ = read(out)
    q = t["w"].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.isnan(q[1, 2]) and q[3, 4] == 448 and q[5, 6] == -448


def test_compare_matches_the_quantize_reports(tmp_path, capsys):
    path = tmp_path / "tiny.safetensors"
    assert run("example", path) == 0
    capsys.readouterr()
    assert run("compare", path, "--device", "cpu", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    # The default columns are gpuq quantize's defaults for each code type.
    assert [s["scheme"] for s in report["schemes"]] == ["int8", "int4", "float8_e4m3fn"]
    flags = {"int8": [], "int4": ["--dtype", "int4"], "float8_e4m3fn": ["--dtype", "float8_e4m3fn"]}
    for k, (scheme, f) in enumerate(flags.items()):
        out = tmp_path / f"q{k}.safetensors"
        assert run("quantize", path, "-o", out, "--device", "cpu", "-q", "--json", *f) == 0
        q = json.loads(capsys.readouterr().out)
        assert report["total"]["sqnr_db"][k] == pytest.approx(q["total"]["sqnr_db"], abs=1e-12)
        assert report["total"]["bytes_after"][k] == sum(
            r["bytes_after"] for r in q["tensors"] if r["quantized"])
        per = {r["name"]: r["sqnr_db"] for r in q["tensors"] if r["quantized"]}
        assert {r["name"]: r["sqnr_db"][k] for r in report["tensors"]} == per
    # The table: one column per scheme.
    assert run("compare", path, "--device", "cpu", "--scheme", "int8:sym",
               "--scheme", "uint4:g64", "--scheme", "float8_e5m2:tensor") == 0
    text = capsys.readouterr().out
    assert "int8 sym axis=0" in text and "uint4 asym axis=-1 g=64" in text
    assert "float8_e5m2 per-tensor" in text and "total: 16 tensors" in text


@pytest.mark.parametrize("spec,message", [
    ("int3", "the code type 'int3' is not one of"),
    ("int4:g0", "'g0' is not an option"),
    ("int4:tensor:g8", "give one of 'tensor', 'bAxB' and an axis or group size"),
    ("int8:b4x4:g8", "give one of 'tensor', 'bAxB' and an axis or group size"),
    ("int8:b4x0", "'b4x0' must be AxB, two positive integers or -1 for a whole dimension (e.g. 128x128, -1x128), got '4x0'"),
    ("int8:fast", "'fast' is not an option"),
])
def test_compare_refuses_bad_schemes(tmp_path, capsys, spec, message):
    assert run("compare", tmp_path / "missing.safetensors", "--scheme", spec) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_device_path_gives_the_same_files(tmp_path, capsys, monkeypatch):
    """The CLI's device side (Codes in and out of a GPU array library: fp8 bits as Codes,
    packed rows sliced as Codes) writes the host's bytes. A stand-in 'cupy' whose arrays
    are NumPy's: what runs is the CLI's own code on that path (the kernels have their own
    tests)."""
    import sys
    import types

    from gpuq.checkpoints import env as cli_env

    fake = types.ModuleType("cupy")
    fake.ndarray = type("FakeCupyArray", (), {})
    fake.asarray, fake.asnumpy = np.asarray, np.asarray
    src, _ = make_source(tmp_path, "npz")
    outs = {}
    for device in ("cpu", "cuda"):
        if device == "cuda":
            monkeypatch.setitem(sys.modules, "cupy", fake)
            monkeypatch.setattr(cli_env, "cuda_unavailable_reason", lambda: None)
        for dtype, flags in (("int4", ["--group-size", "8"]), ("float8_e5m2", [])):
            q, b = tmp_path / f"q-{dtype}-{device}.npz", tmp_path / f"b-{dtype}-{device}.npz"
            assert run("quantize", src, "-o", q, "--dtype", dtype, "--min-size", "16",
                       "--device", device, "--json", *flags) == 0, capsys.readouterr().err
            rq = json.loads(capsys.readouterr().out)
            assert rq["device"] == device
            assert run("dequantize", q, "-o", b, "--device", device, "-q") == 0
            capsys.readouterr()
            outs[dtype, device] = rq["tensors"], read(q)[0], read(b)[0]
    for dtype in ("int4", "float8_e5m2"):
        (rc, qc, bc), (rg, qg, bg) = outs[dtype, "cpu"], outs[dtype, "cuda"]
        assert_same_rows(rc, rg)  # the host's one pass sums the SQNR's energies in another order
        for a, b in ((qc, qg), (bc, bg)):
            assert a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)


def test_readme_compare_block_is_real_output(tmp_path, capsys, monkeypatch):
    """The README's `gpuq compare tiny.safetensors` block is what the command prints."""
    text = (HERE.parent / "README.md").read_text()
    start = text.index("$ gpuq compare tiny.safetensors\n") + len("$ gpuq compare tiny.safetensors\n")
    block = text[start:text.index("```", start)].rstrip("\n")
    monkeypatch.chdir(tmp_path)
    assert run("example", "tiny.safetensors") == 0
    capsys.readouterr()
    assert run("compare", "tiny.safetensors", "--device", "cpu") == 0
    assert capsys.readouterr().out.rstrip("\n") == block


# -- fuzz: random edits of version-2 files ---------------------------------------------------

def _fuzz_edits():
    from hypothesis import strategies as st

    one_byte = ["uint8", "int8", "bool", "float8_e4m3fn", "float8_e5m2"]
    field = st.tuples(st.just("field"),
                      st.sampled_from(["dtype", "symmetric", "axis", "group_size", "shape",
                                       "packing", "other"]),
                      st.sampled_from([None, 0, 1, 2, 4, 5, -1, True, False, "int4", "uint4",
                                       "int8", "float8_e4m3fn", "float8_e5m2", "onnx_nibbles",
                                       [9, 13], [13, 9], [117], [9, 14], [], [0, 1], [1, 0]]))
    return st.one_of(
        field,
        st.tuples(st.just("drop"), st.sampled_from(["dtype", "symmetric", "axis", "group_size",
                                                    "shape", "packing"])),
        st.tuples(st.just("version"), st.sampled_from([1, 2, 3, "2", None])),
        st.tuples(st.just("retype"), st.sampled_from(["w", "w.zps", "w.scales"]),
                  st.sampled_from(one_byte + ["float32", "int32"])),
        st.tuples(st.just("reshape"), st.sampled_from(["w", "w.zps", "w.scales"]),
                  st.sampled_from(["flat", "transpose", "add1", "drop_last", "add_byte"])),
        st.tuples(st.just("values"), st.sampled_from(["w", "w.zps"]),
                  st.integers(0, 255), st.integers(0, 200)),
        st.tuples(st.just("add_zps"), st.sampled_from(["int8", "uint8"])),
        st.tuples(st.just("drop_tensor"), st.sampled_from(["w", "w.zps", "w.scales"])),
    )


def _apply(tensors, meta, e, fmt):
    s = meta["tensors"]["w"]
    kind = e[0]
    if kind == "field":
        s[e[1]] = e[2]
    elif kind == "drop":
        s.pop(e[1], None)
    elif kind == "version":
        if e[1] is None:
            meta.pop("format_version", None)
        else:
            meta["format_version"] = e[1]
    elif kind == "add_zps":
        if "w.scales" in tensors:
            tensors["w.zps"] = np.zeros(tensors["w.scales"].shape, e[1])
    elif e[1] not in tensors:
        return
    elif kind == "drop_tensor":
        del tensors[e[1]]
    elif kind == "retype":
        a = tensors[e[1]]
        dt = np.dtype(FP8[e[2]]) if e[2] in FP8 else np.dtype(e[2])
        if fmt == "npz" and e[2] in FP8:
            return  # .npy has no fp8 type
        if dt.itemsize == a.dtype.itemsize:
            tensors[e[1]] = a.view(dt)
        elif a.size:
            raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            tensors[e[1]] = raw[: a.nbytes // dt.itemsize * dt.itemsize].view(dt)
    elif kind == "reshape":
        a = tensors[e[1]]
        how = e[2]
        if how == "flat":
            tensors[e[1]] = a.reshape(-1)
        elif how == "transpose":
            tensors[e[1]] = np.ascontiguousarray(a.T)
        elif how == "add1":
            tensors[e[1]] = a.reshape(*a.shape, 1)
        elif how == "drop_last" and a.size:
            tensors[e[1]] = a.reshape(-1)[:-1]
        elif how == "add_byte":
            tensors[e[1]] = np.append(a.reshape(-1), a.reshape(-1)[:1])
    elif kind == "values":
        a = tensors[e[1]].copy()
        if a.size:
            flat = a.reshape(-1).view(np.uint8)
            flat[e[3] % flat.size] = e[2]
            tensors[e[1]] = a


def _layout_ok(tensors, meta, fmt):
    """What a file gpuq reads must be (the module docstring of gpuq/checkpoints/quantized.py)."""
    assert meta["format_version"] in (1, 2, 3)
    s = meta["tensors"]["w"]
    dtype = s["dtype"]
    assert dtype in NEW or dtype in ("int8", "uint8")
    if dtype in NEW:
        assert meta["format_version"] >= 2
    packed = dtype in ("int4", "uint4")
    base = {"dtype", "symmetric", "axis", "group_size", "source_dtype"}
    assert set(s) == base | ({"shape", "packing"} if packed else set())
    q = tensors["w"]
    shape = tuple(s["shape"]) if packed else q.shape
    if packed:
        assert s["packing"] == "onnx_nibbles"
        assert q.dtype == np.uint8 and q.shape == ((math.prod(shape) + 1) // 2,)
        if math.prod(shape) % 2:
            assert q[-1] >> 4 == 0
    elif dtype in FP8:
        assert s["symmetric"] is True
        assert q.dtype == (np.dtype(FP8[dtype]) if fmt == "safetensors" else np.uint8)
    else:
        assert q.dtype == np.dtype(dtype)
    axis, g = s["axis"], s["group_size"]
    sc = tensors["w.scales"]
    assert sc.dtype == np.float32
    if axis is None:
        assert g is None and sc.shape in ((), (1,))
    elif isinstance(axis, list):
        assert meta["format_version"] == 3 and g is None and axis == sorted(set(axis))
        assert len(axis) >= 2 and sc.shape == tuple(shape[k] for k in axis)
    elif g is None:
        assert sc.shape == (shape[axis],)
    else:
        assert sc.shape == tuple(-(-d // g) if i == axis else d for i, d in enumerate(shape))
    z = tensors.get("w.zps")
    if dtype in FP8 or (s["symmetric"] and dtype in ("int8", "int4")):
        assert z is None
    else:
        assert z.dtype == (np.int8 if dtype in ("int8", "int4") else np.uint8)
        assert z.shape == sc.shape
        if packed:
            lo, hi = (-8, 7) if dtype == "int4" else (0, 15)
            assert lo <= z.min() and z.max() <= hi
    return shape


@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzz_version_2_files(tmp_path, v2_bases, fmt):
    """Random edits of int4/uint4/fp8 files: each is refused (one line, exit 2, nothing
    written) or read as exactly what a file of that layout means."""
    from hypothesis import strategies as st

    from _hypothesis import run as hrun

    bases = {d: read(v2_bases[d, fmt]) for d in NEW}
    counter = iter(range(10**9))

    def check(case):
        dtype, edits = case
        tensors, meta, extra = (dict(bases[dtype][0]), json.loads(json.dumps(bases[dtype][1])),
                                bases[dtype][2])
        for e in edits:
            _apply(tensors, meta, e, fmt)
        d = tmp_path / f"case{next(counter)}"
        d.mkdir()
        src, out = d / f"in.{fmt}", d / f"out.{fmt}"
        write(src, tensors, meta, extra)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["dequantize", str(src), "-o", str(out), "--device", "cpu", "-q"])
        if code == 2:
            lines = err.getvalue().strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("gpuq: error: "), err.getvalue()
            assert sorted(os.listdir(d)) == [src.name]
            return
        assert code == 0, err.getvalue()
        shape = _layout_ok(tensors, meta, fmt)
        got, _, _ = read(out)
        s = meta["tensors"]["w"]
        want = naive_dequantize(tensors, "w", s, fmt).reshape(shape)
        assert same_bits(got["w"], want)
        assert same_bits(got["b"], tensors["b"])

    hrun(check, st.tuples(st.sampled_from(NEW), st.lists(_fuzz_edits(), min_size=1,
                                                            max_size=3)), 150)
