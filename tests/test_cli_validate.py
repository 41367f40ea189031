"""``gpuq dequantize`` trusts nothing in the file: every tensor is held to the gpuq metadata.

Each case takes a file written by ``gpuq quantize``, changes one thing with the
safetensors library / NumPy (never with gpuq), and demands exit code 2, one
``gpuq: error:`` line that names the tensor, and no output file. Before issue 17,
most of these dequantized without a word: uint8 codes read as int8 (or int8 zero
points as uint8) gave errors of several units on weights of +-5, a deleted
``NAME.zps`` was taken as zero point 0, and any format version was accepted.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from gpuq import cli

safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open

FORMATS = ["safetensors", "npz"]
BASES = {"asym_i8": [], "asym_u8": ["--dtype", "uint8"], "sym_i8": ["--symmetric"],
         "group": ["--group-size", "8"]}


def read(path):
    if str(path).endswith(".safetensors"):
        with safe_open(str(path), framework="np") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = dict(f.metadata() or {})
        return tensors, json.loads(meta["gpuq"]), {k: v for k, v in meta.items() if k != "gpuq"}
    with np.load(path, allow_pickle=False) as z:
        tensors = {k: z[k] for k in z.files}
    return tensors, json.loads(str(tensors.pop("__gpuq__"))), {}


def write(path, tensors, meta, extra):
    """Write a quantized file the way gpuq lays it out, with the libraries; ``meta`` may be
    a dict (JSON-encoded here) or a string (written as it is)."""
    text = meta if isinstance(meta, str) else json.dumps(meta)
    if str(path).endswith(".safetensors"):
        safetensors_numpy.save_file(tensors, str(path), metadata={**extra, "gpuq": text})
    else:
        np.savez(path, __gpuq__=np.array(text), **tensors)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("bases")
    rng = np.random.default_rng(17)
    w = (rng.standard_normal((48, 40)) * 1.5).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    out = {}
    for fmt in FORMATS:
        src = d / f"src.{fmt}"
        if fmt == "safetensors":
            safetensors_numpy.save_file({"w": w, "b": b}, str(src), metadata={"format": "pt"})
        else:
            np.savez(src, w=w, b=b)
        for base, flags in BASES.items():
            dst = d / f"{base}.{fmt}"
            assert cli.main(["quantize", str(src), "-o", str(dst), "--device", "cpu", "-q",
                             "--json", *flags]) == 0
            out[base, fmt] = dst
    return out


def _drop(key):
    def edit(t, m):
        del t[key]
    return edit


def _set(key, fn):
    def edit(t, m):
        t[key] = fn(t[key])
    return edit


def _scheme(**changes):
    def edit(t, m):
        m["tensors"]["w"].update(changes)
    return edit


def _meta(fn):
    def edit(t, m):
        fn(m)
    return edit


CASES = [
    # (id, base, edit, words the one error line must hold)
    ("codes uint8 for int8", "asym_i8", _set("w", lambda a: a.view(np.uint8)),
     "tensor 'w': its codes 'w' are uint8, but the gpuq metadata says int8 asymmetric axis 0"),
    ("codes int8 for uint8", "asym_u8", _set("w", lambda a: a.view(np.int8)),
     "its codes 'w' are int8, but the gpuq metadata says uint8"),
    ("zps int8 for uint8", "asym_u8", _set("w.zps", lambda a: a.view(np.int8)),
     ("its zero points 'w.zps' are int8, but the gpuq metadata says uint8 asymmetric axis 0, "
      "which needs uint8")),
    ("zps int32", "asym_i8", _set("w.zps", lambda a: a.astype(np.int32)),
     "its zero points 'w.zps' are int32"),
    ("zps deleted", "asym_i8", _drop("w.zps"),
     "tensor 'w': its zero points 'w.zps' are missing"),
    ("zps on symmetric int8", "sym_i8", lambda t, m: t.update({"w.zps": np.zeros(48, np.int8)}),
     ("the file has 'w.zps', but the gpuq metadata says int8 symmetric axis 0, which has no "
      "zero points")),
    ("scales float16", "asym_i8", _set("w.scales", lambda a: a.astype(np.float16)),
     "its scales 'w.scales' are float16"),
    ("scales float64", "sym_i8", _set("w.scales", lambda a: a.astype(np.float64)),
     "its scales 'w.scales' are float64"),
    ("scales short", "asym_i8", _set("w.scales", lambda a: a[:-1]),
     ("its scales 'w.scales' have shape [47], but int8 asymmetric axis 0 of shape [48, 40] "
      "needs [48]")),
    ("zps 2-D", "asym_u8", _set("w.zps", lambda a: a.reshape(48, 1)),
     "its zero points 'w.zps' have shape [48, 1]"),
    ("scales missing", "sym_i8", _drop("w.scales"), "its scales 'w.scales' are missing"),
    ("codes missing", "asym_i8", _drop("w"),
     "tensor 'w' is in the gpuq metadata but not in the file"),
    ("group size changed", "group", _scheme(group_size=16),
     ("its scales 'w.scales' have shape [48, 5], but int8 asymmetric axis 1, group size 16 of "
      "shape [48, 40] needs [48, 3]")),
    ("per-channel on the other axis", "asym_i8", _scheme(axis=1),
     "needs [40]"),
    ("axis out of range", "asym_i8", _scheme(axis=2),
     "tensor 'w': the gpuq metadata says axis 2, but the codes have shape [48, 40]"),
    ("dtype int4", "asym_i8", _scheme(dtype="int4"),
     "tensor 'w': dtype 'int4' needs format version 2, but the file says version 1"),
    ("symmetric as text", "asym_i8", _scheme(symmetric="no"),
     "tensor 'w': symmetric is 'no', not true or false"),
    ("group size 0", "group", _scheme(group_size=0),
     "tensor 'w': group_size 0 is not null or an integer >= 1 with an axis"),
    ("negative axis", "asym_i8", _scheme(axis=-1), "tensor 'w': axis -1 is not null"),
    ("unknown key", "asym_i8", _scheme(scale_dtype="float16"),
     "tensor 'w': unknown keys 'scale_dtype' for int8 codes (expected axis, dtype, group_size, "
     "source_dtype, symmetric)"),
    ("scheme not a table", "asym_i8", _meta(lambda m: m["tensors"].update(w=[0, 1])),
     "tensor 'w': the scheme is [0, 1], not a table"),
    ("no tensors table", "asym_i8", _meta(lambda m: m.pop("tensors")), "no 'tensors' table"),
    ("format version 99", "asym_i8", _meta(lambda m: m.update(format_version=99)),
     "format version 99, newer than this gpuq reads"),
    ("scales listed as quantized", "asym_i8",
     _meta(lambda m: m["tensors"].update({"w.scales": dict(m["tensors"]["w"])})),
     "tensor 'w.scales'"),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dequantize_refuses_what_the_metadata_does_not_say(bases, tmp_path, capsys, fmt, case):
    _, base, edit, message = case
    tensors, meta, extra = read(bases[base, fmt])
    edit(tensors, meta)
    src = tmp_path / f"in.{fmt}"
    write(src, tensors, meta, extra)
    before = sorted(os.listdir(tmp_path))
    code = cli.main(["dequantize", str(src), "-o", str(tmp_path / f"out.{fmt}"),
                     "--device", "cpu", "-q"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"gpuq: error: cannot read IN {str(src)!r}: "), lines[0]
    assert message in lines[0], lines[0]
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary file


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("text,message", [
    ("not json", "its gpuq metadata is not valid"),
    ('{"format_version": 1, "tensors": {"w": NaN}}', "its gpuq metadata is not valid"),
    ("[1, 2]", "no 'tensors' table"),
])
def test_metadata_that_is_not_json(bases, tmp_path, capsys, fmt, text, message):
    tensors, _, extra = read(bases["asym_i8", fmt])
    src = tmp_path / f"in.{fmt}"
    write(src, tensors, text, extra)
    code = cli.main(["dequantize", str(src), "-o", str(tmp_path / f"out.{fmt}"), "--device", "cpu"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / f"out.{fmt}").exists()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("base", sorted(BASES))
def test_rewritten_bases_still_dequantize(bases, tmp_path, capsys, fmt, base):
    """Control: a base file read and written again by the libraries, unchanged, dequantizes
    to exactly what the original does (the refusals above are the edits' doing)."""
    tensors, meta, extra = read(bases[base, fmt])
    src = tmp_path / f"in.{fmt}"
    write(src, tensors, meta, extra)
    for path, out in ((src, "a"), (bases[base, fmt], "b")):
        assert cli.main(["dequantize", str(path), "-o", str(tmp_path / f"{out}.{fmt}"),
                         "--device", "cpu", "-q"]) == 0, capsys.readouterr().err
    a, b = read_plain(tmp_path / f"a.{fmt}"), read_plain(tmp_path / f"b.{fmt}")
    assert a.keys() == b.keys() == {"w", "b"}
    assert all(a[k].tobytes() == b[k].tobytes() and a[k].dtype == b[k].dtype for k in a)


def read_plain(path):
    if str(path).endswith(".safetensors"):
        return safetensors_numpy.load_file(str(path))
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
