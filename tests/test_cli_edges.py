"""Edges of the command line found by a demanding new user (issue 26, points 4, 5 and 6).

* A .safetensors OUT whose header would pass the format's 100,000,000-byte limit (an IN
  near it, plus the scales, zero points and gpuq metadata) is refused before anything is
  written, instead of a file that no reader opens.
* float64 tensors come back float64, divided and multiplied in float64, and ``--dtype
  float64`` is a choice of ``gpuq dequantize``.
* ``gpuq compare`` takes a sharded checkpoint; a shard that is a folder and an .npz member
  that is a raw pickle are named as what they are.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

from gpuq import cli

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open  # noqa: E402
from test_cli_formats import read  # noqa: E402
from test_cli_sharded import INDEX, OPTIONS, make_sharded, shard_name  # noqa: E402

LIMIT = 100_000_000  # the safetensors library's MAX_HEADER_SIZE


def run(*args):
    return cli.main([str(a) for a in args])


def one_error(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuq: error: "), err
    for w in words:
        assert w in err[0], err[0]
    return err[0]


# -- point 4: the header limit --------------------------------------------------------------

def test_output_header_over_the_limit_is_refused_before_writing(tmp_path, capsys):
    w = np.random.default_rng(0).standard_normal((40, 40)).astype(np.float32)
    probe = tmp_path / "probe.safetensors"
    safetensors_numpy.save_file({"w": w}, str(probe), metadata={"pad": ""})
    raw = probe.read_bytes()
    base = len(raw[8:8 + int.from_bytes(raw[:8], "little")].rstrip(b" "))  # less its padding
    src = tmp_path / "in.safetensors"
    # A header of exactly the limit, the largest the library reads: the input is a valid file.
    safetensors_numpy.save_file({"w": w}, str(src), metadata={"pad": "x" * (LIMIT - base)})
    assert int.from_bytes(src.read_bytes()[:8], "little") == LIMIT
    with safe_open(str(src), framework="np") as f:
        assert f.get_tensor("w").shape == (40, 40)
    probe.unlink()
    before = sorted(os.listdir(tmp_path))
    assert run("quantize", src, "-o", tmp_path / "q.safetensors", "--device", "cpu", "-q") == 2
    one_error(capsys, f"cannot write OUT {str(tmp_path / 'q.safetensors')!r}: its safetensors "
                      f"header would be 100,000,", "over the 100,000,000 the format allows")
    assert sorted(os.listdir(tmp_path)) == before  # no OUT, no temporary file


def test_sharded_output_header_is_checked_before_any_shard(tmp_path, capsys, monkeypatch):
    """Every output shard's header is held to the limit before the first shard is written
    (the limit made small here: the arithmetic is the same)."""
    from gpuq.checkpoints import files

    make_sharded(tmp_path / "in", n_shards=3)
    header = {}
    for i in range(3):
        raw = (tmp_path / "in" / shard_name(i, 3)).read_bytes()
        header[i] = int.from_bytes(raw[:8], "little")
    # Over the limit: the last shard's output header only (its input header is under it).
    monkeypatch.setattr(files, "MAX_HEADER", max(header.values()) + 64)
    writes = []
    monkeypatch.setattr(files._SafetensorsWriter, "_write",
                        lambda self, name, arr: writes.append(name))
    assert run("quantize", tmp_path / "in", "-o", tmp_path / "out", *OPTIONS) == 2
    one_error(capsys, "its safetensors header would be", "model-0000")
    assert writes == [] and not (tmp_path / "out").exists()


# -- point 5: float64 -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_float64_round_trips_as_float64(tmp_path, capsys, fmt):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((24, 40)) * 0.3  # float64
    x[3, :4] = [1e-300, -0.5 + 2**-40, 0.25, 7.0]
    src, q, back = tmp_path / f"in.{fmt}", tmp_path / f"q.{fmt}", tmp_path / f"b.{fmt}"
    if fmt == "npz":
        np.savez(src, w=x)
    else:
        safetensors_numpy.save_file({"w": x}, str(src))
    assert run("quantize", src, "-o", q, "--min-size", "64", "--device", "cpu", "-q") == 0
    t, meta, _ = read(q)
    assert meta["tensors"]["w"]["source_dtype"] == "float64"
    codes, s32, zp = t["w"], t["w.scales"], t["w.zps"].astype(np.int64)
    s = s32.astype(np.float64).reshape(-1, 1)
    # The codes: one division in float64 by the stored (float32) scale, rounded half to even.
    want = np.clip(np.rint(x / s) + zp.reshape(-1, 1), -128, 127).astype(np.int8)
    assert np.array_equal(codes, want)
    for flags in ([], ["--dtype", "float64"]):
        assert run("dequantize", q, "-o", back, "--device", "cpu", "-q", *flags) == 0
        y, _, _ = read(back)
        # One multiplication in float64: not the float32 product widened.
        expect = (codes.astype(np.int64) - zp.reshape(-1, 1)).astype(np.float64) * s
        assert y["w"].dtype == np.float64 and y["w"].tobytes() == expect.tobytes()
        assert not np.array_equal(y["w"], expect.astype(np.float32).astype(np.float64))


def test_dequantize_float64_from_bfloat16(tmp_path, capsys):
    x = (np.random.default_rng(6).standard_normal((16, 64)) * 0.1).astype(ml_dtypes.bfloat16)
    src, q = tmp_path / "in.safetensors", tmp_path / "q.safetensors"
    safetensors_numpy.save_file({"w": x}, str(src))
    assert run("quantize", src, "-o", q, "--device", "cpu", "-q") == 0
    assert run("dequantize", q, "-o", tmp_path / "b.safetensors", "--dtype", "float64",
               "--device", "cpu", "-q") == 0
    t, _, _ = read(q)
    y, _, _ = read(tmp_path / "b.safetensors")
    expect = ((t["w"].astype(np.int64) - t["w.zps"].astype(np.int64).reshape(-1, 1))
              .astype(np.float64) * t["w.scales"].astype(np.float64).reshape(-1, 1))
    assert y["w"].dtype == np.float64 and y["w"].tobytes() == expect.tobytes()


# -- point 6: compare on a sharded checkpoint, and two messages -------------------------------

def test_compare_reads_a_sharded_checkpoint(tmp_path, capsys):
    make_sharded(tmp_path / "in", n_shards=3)
    for path in (tmp_path / "in", tmp_path / "in" / INDEX):
        assert run("compare", path, "--device", "cpu", "--json", "--scheme", "int8",
                   "--scheme", "int4:g32") == 0
        report = json.loads(capsys.readouterr().out)
        assert report["total"]["quantized"] == 6
        for k, flags in enumerate((["--axis", "0"], ["--dtype", "int4", "--group-size", "32"])):
            assert run("quantize", tmp_path / "in", "-o", tmp_path / f"q{k}", "--device", "cpu",
                       "-q", "--json", *flags) == 0
            q = json.loads(capsys.readouterr().out)
            assert report["total"]["sqnr_db"][k] == pytest.approx(q["total"]["sqnr_db"],
                                                                  abs=1e-12)
            assert {r["name"]: r["sqnr_db"][k] for r in report["tensors"]} == {
                r["name"]: r["sqnr_db"] for r in q["tensors"] if r["quantized"]}
            for p in (tmp_path / f"q{k}").iterdir():
                p.unlink()
            (tmp_path / f"q{k}").rmdir()
    assert run("quantize", tmp_path / "in", "-o", tmp_path / "q", "--device", "cpu", "-q") == 0
    assert run("compare", tmp_path / "q", "--device", "cpu") == 2
    one_error(capsys, "is already quantized by gpuq (shard 'model-00001-of-00003.safetensors')")


def test_a_shard_that_is_a_folder_is_called_one(tmp_path, capsys):
    make_sharded(tmp_path / "in", n_shards=2)
    shard = tmp_path / "in" / shard_name(1, 2)
    shard.unlink()
    shard.mkdir()
    assert run("quantize", tmp_path / "in", "-o", tmp_path / "out", *OPTIONS) == 2
    one_error(capsys, f"shard {shard_name(1, 2)!r} named in the weight_map is a folder, not a "
                      f"file")
    assert not (tmp_path / "out").exists()


def test_npz_member_holding_a_pickle_is_named(tmp_path, capsys):
    src = tmp_path / "in.npz"
    buf = io.BytesIO()
    np.save(buf, np.ones((40, 40), np.float32))
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("w.npy", buf.getvalue())
        z.writestr("opt_state.npy", pickle.dumps({"step": 1}))
    for command in (["quantize", src, "-o", tmp_path / "q.npz"], ["compare", src]):
        assert run(*command, "--device", "cpu") == 2
        one_error(capsys, f"cannot read IN {str(src)!r}: member 'opt_state.npy' is not an .npy "
                          f"array: it does not start with NumPy's magic b'\\x93NUMPY' (it is a "
                          f"Python pickle, which gpuq does not load)")
    assert not (tmp_path / "q.npz").exists()


def test_unknown_and_missing_keys_are_worded_as_found(tmp_path, capsys):
    """Only what is wrong is named: no "missing keys []" beside an unknown one."""
    src = tmp_path / "in.npz"
    np.savez(src, w=np.random.default_rng(1).standard_normal((8, 40)).astype(np.float32))
    assert run("quantize", src, "-o", tmp_path / "q.npz", "--min-size", "1", "--device", "cpu",
               "-q") == 0
    t, meta, _ = read(tmp_path / "q.npz")
    for edit, words in ((lambda s: s.update(scale_dtype="f16"),
                         "tensor 'w': unknown keys 'scale_dtype' for int8 codes (expected axis, "
                         "dtype, group_size, source_dtype, symmetric)"),
                        (lambda s: s.pop("symmetric"),
                         "tensor 'w': missing keys 'symmetric' for int8 codes")):
        m = json.loads(json.dumps(meta))
        edit(m["tensors"]["w"])
        bad = tmp_path / "bad.npz"
        np.savez(bad, __gpuq__=np.array(json.dumps(m)), **t)
        assert run("dequantize", bad, "-o", tmp_path / "o.npz", "--device", "cpu") == 2
        line = one_error(capsys, words)
        what = line[line.index("tensor 'w'"):]
        assert "[]" not in what and ("unknown" in what) != ("missing" in what)
