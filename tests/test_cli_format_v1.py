"""The file format is a promise: files written by format version 1 read the same forever.

``tests/data/format_v1/`` holds quantized files written by the first gpuq (see its
README): six schemes x (.safetensors, .npz), their sources, and version 1's own float32
dequantizations. Today's ``gpuq dequantize`` must give, bit for bit, what a naive
``(q - zp) * s`` gives from the stored codes, scales and zero points, read with the
safetensors library and NumPy (not gpuq), and what version 1 gave. A file that claims
a format version this gpuq does not know is refused with a clear message.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gpuq import cli

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open

DATA = Path(__file__).resolve().parent / "data" / "format_v1"
VARIANTS = ["pc_asym_int8", "pc_asym_uint8", "pc_sym_int8", "axis1_sym_uint8",
            "group10_asym_int8", "tensor_asym_uint8"]
FORMATS = ["safetensors", "npz"]
QUANTIZED = ["model.layers.0.w", "model.layers.10.w", "model.layers.2.w"]
KEPT = ["model.norm", "ids", "small"]


def read_raw(path):
    """Tensors and gpuq metadata as the safetensors library / NumPy read them."""
    if str(path).endswith(".safetensors"):
        with safe_open(str(path), framework="np") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = dict(f.metadata() or {})
        return tensors, json.loads(meta["gpuq"]) if "gpuq" in meta else None
    with np.load(path, allow_pickle=False) as z:
        tensors = {k: z[k] for k in z.files}
    meta = tensors.pop("__gpuq__", None)
    return tensors, None if meta is None else json.loads(str(meta))


def naive_dequantize(q, scales, zps, scheme, dtype):
    """``(q - zp) * s``: the integer difference, converted once, one float32 multiplication,
    rounded to ``dtype`` (DESIGN section 1), with the scales broadcast by hand."""
    axis, g = scheme["axis"], scheme["group_size"]
    s = np.asarray(scales, np.float32)
    z = np.zeros(s.shape, np.int64) if zps is None else np.asarray(zps).astype(np.int64)
    if axis is None:
        assert s.size == 1
        s, z = s.reshape(()), z.reshape(())
    elif g is None:
        view = [1] * q.ndim
        view[axis] = -1
        s, z = s.reshape(view), z.reshape(view)
    else:
        n = q.shape[axis]
        s = np.repeat(s, g, axis=axis).take(np.arange(n), axis=axis)
        z = np.repeat(z, g, axis=axis).take(np.arange(n), axis=axis)
    diff = (q.astype(np.int64) - z).astype(np.float32)  # exact: |q - zp| <= 255
    return (diff * s).astype(dtype)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_fixture_is_version_1():
    """The fixture is what it says: version 1 metadata, every file present, unchanged schemes."""
    for fmt in FORMATS:
        for v in VARIANTS:
            tensors, meta = read_raw(DATA / f"{v}.{fmt}")
            assert meta["format_version"] == 1 and meta["source_format"] == fmt
            assert sorted(meta["tensors"]) == sorted(QUANTIZED)
            scheme = meta["tensors"]["model.layers.0.w"]
            assert scheme["dtype"] == ("int8" if "int8" in v and "uint8" not in v else "uint8")
            assert (DATA / f"{v}.f32.{fmt}").exists()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_version_1_reads_the_same(tmp_path, capsys, variant, fmt):
    src = DATA / f"{variant}.{fmt}"
    q, meta = read_raw(src)
    v1_f32, _ = read_raw(DATA / f"{variant}.f32.{fmt}")
    source, _ = read_raw(DATA / f"source.{fmt}")
    for dtype in ("float32", "float16"):
        out = tmp_path / f"out.{dtype}.{fmt}"
        code = cli.main(["dequantize", str(src), "-o", str(out), "--dtype", dtype,
                         "--device", "cpu", "-q"])
        assert code == 0, capsys.readouterr().err
        back, back_meta = read_raw(out)
        assert back_meta is None and set(back) == set(source)
        for name in QUANTIZED:
            scheme = meta["tensors"][name]
            want = naive_dequantize(q[name], q[name + ".scales"], q.get(name + ".zps"),
                                    scheme, dtype)
            assert (name + ".zps" in q) == (scheme["dtype"] == "uint8" or not scheme["symmetric"])
            assert same_bits(back[name], want), (variant, name, dtype)
            if dtype == "float32":
                assert same_bits(v1_f32[name], want), (variant, name)  # version 1 gave the same
        for name in KEPT:
            assert same_bits(back[name], source[name])
    if fmt == "safetensors":
        with safe_open(str(tmp_path / "out.float32.safetensors"), framework="np") as f:
            assert f.metadata() == {"format": "pt"}


def _with_meta(src, dst, edit):
    """Copy a fixture file with its gpuq metadata edited by ``edit(meta)`` (written by the
    safetensors library / zipfile, not by gpuq)."""
    if str(src).endswith(".safetensors"):
        with safe_open(str(src), framework="np") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            metadata = dict(f.metadata())
        meta = json.loads(metadata["gpuq"])
        edit(meta)
        metadata["gpuq"] = json.dumps(meta)
        safetensors_numpy.save_file(tensors, str(dst), metadata=metadata)
        return
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "__gpuq__.npy":
                with zin.open(info) as fh:
                    meta = json.loads(str(np.lib.format.read_array(fh)))
                edit(meta)
                path = Path(dst).with_suffix(".meta.npy")
                np.save(path, np.array(json.dumps(meta)))
                data = path.read_bytes()
                os.unlink(path)
            zout.writestr(info.filename, data)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("version,message", [
    (6, ("written in gpuq file format version 6, newer than this gpuq reads (version 5); "
         "upgrade gpuq")),
    (99, "format version 99, newer"),
    ("1", "format_version is '1', expected 1, 2, 3, 4 or 5"),
    (0, "format_version is 0, expected 1, 2, 3, 4 or 5"),
    (None, "format_version is None, expected 1, 2, 3, 4 or 5"),
])
def test_unknown_version_is_refused(tmp_path, capsys, fmt, version, message):
    src = tmp_path / f"v.{fmt}"

    def edit(meta):
        if version is None:
            del meta["format_version"]
        else:
            meta["format_version"] = version

    _with_meta(DATA / f"pc_asym_int8.{fmt}", src, edit)
    before = sorted(os.listdir(tmp_path))
    code = cli.main(["dequantize", str(src), "-o", str(tmp_path / f"o.{fmt}"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("gpuq: error: cannot read IN")
    assert message in err[0]
    assert sorted(os.listdir(tmp_path)) == before


def test_copy_of_fixture_still_reads(tmp_path, capsys):
    """The edit helper itself changes nothing but the metadata (so the refusals above are
    the version's doing)."""
    for fmt in FORMATS:
        src = tmp_path / f"same.{fmt}"
        _with_meta(DATA / f"pc_asym_int8.{fmt}", src, lambda meta: None)
        assert cli.main(["dequantize", str(src), "-o", str(tmp_path / f"o.{fmt}"),
                         "--device", "cpu", "-q"]) == 0, capsys.readouterr().err


#: The fixture's commands (its README). The ``pc_*`` files were written with no scheme
#: flag, when the default was axis 0 for every tensor; the default of the rank-3 tensor is
#: one scale per row now (format version 3), so axis 0 is asked for by name.
V1_FLAGS = {"pc_asym_int8": ["--axis", "0"], "pc_asym_uint8": ["--axis", "0", "--dtype", "uint8"],
            "pc_sym_int8": ["--axis", "0", "--symmetric"],
            "axis1_sym_uint8": ["--axis", "1", "--symmetric", "--dtype", "uint8"],
            "group10_asym_int8": ["--group-size", "10"],
            "tensor_asym_uint8": ["--per-tensor", "--dtype", "uint8"]}


def sorted_metadata(raw: bytes) -> bytes:
    """A .safetensors file's bytes with its metadata keys in sorted order, as gpuq writes them
    since issue 17 (one fixture file, axis1_sym_uint8, was written before): the header
    re-serialized compactly and padded to 8 bytes again, the data section as it was."""
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + raw[8 + n:]


@pytest.mark.parametrize("fmt", FORMATS)
def test_todays_writer_writes_the_version_1_bytes(tmp_path, capsys, fmt):
    """int8/uint8 files with one axis per tensor are still version 1, byte for byte what the
    first gpuq wrote; and the default scheme of rank-2 tensors is that same file."""
    for variant, flags in V1_FLAGS.items():
        out = tmp_path / f"{variant}.{fmt}"
        assert cli.main(["quantize", str(DATA / f"source.{fmt}"), "-o", str(out), "--min-size",
                         "64", "--device", "cpu", "-q", *flags]) == 0
        want = (DATA / out.name).read_bytes()
        assert out.read_bytes() == (sorted_metadata(want) if fmt == "safetensors" else want), \
            variant
    rank2 = ["--exclude", "model.layers.10.w"]  # the rank-3 tensor
    for flags in ([], ["--axis", "0"]):
        out = tmp_path / f"rank2{len(flags)}.{fmt}"
        assert cli.main(["quantize", str(DATA / f"source.{fmt}"), "-o", str(out), "--min-size",
                         "64", "--device", "cpu", "-q", *rank2, *flags]) == 0
    assert (tmp_path / f"rank20.{fmt}").read_bytes() == (tmp_path / f"rank22.{fmt}").read_bytes()
    assert read_raw(tmp_path / f"rank20.{fmt}")[1]["format_version"] == 1
