"""Fuzz of the CLI's file readers, and a property test of its writers.

Damaged inputs: valid small files, then truncated, bit-flipped (mostly in the
header), or rewritten with a mutated header that is still well-formed JSON / a
well-formed ``.npy`` header in a zip with correct CRCs (mis-typed dtypes,
shapes, offsets, metadata; for quantized files, dtypes and shapes that still
fit the bytes, and edited gpuq metadata). Every case must end in exit code 2
with one ``gpuq: error:`` line and no output file, or exit 0 with an output
that is right: then the safetensors library / NumPy must read the same input,
and the output must be what the library computes from what they read (for
``dequantize``, only if the file really is what its metadata says). Never a
traceback.

Budgets and CI determinism come from ``tests/_hypothesis.py`` (a fixed number
of examples; derandomized when ``CI`` is set; ``GPUQ_FUZZ=N`` for N times more).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import gpuq
from gpuq import cli

hypothesis = pytest.importorskip("hypothesis")
ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
from _hypothesis import run
from hypothesis import strategies as st
from safetensors import safe_open

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = ("float16", "bfloat16", "float32", "float64")
ST_CODES = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64",
            "U64", "F8_E4M3", "F8_E5M2", "C64", "F8_E8M0", "F4", "F33", "", "f32"]
NPY_DESCRS = ["<f4", "<f8", "<f2", "|i1", "|u1", "<i8", "<i4", ">f4", "|b1", "<c8", "|O",
              "|V4", "<M8[s]", "<U3", "garbage", "<u2"]


# -- running the command -------------------------------------------------------------------

def gpuq_run(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([*map(str, args), "--device", "cpu", "-q", "--json"])
    return code, out.getvalue(), err.getvalue()


def outcome(args, out_path):
    """Run; on failure check the one line and that nothing was left; True when it succeeded."""
    directory = Path(out_path).parent
    before = sorted(os.listdir(directory))
    code, _, err = gpuq_run(*args)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuq: error: "), err
        assert sorted(os.listdir(directory)) == before, "output or temporary file left behind"
        return False
    assert code == 0, (code, err)
    return True


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def oracle_load(path):
    """The input as the safetensors library / NumPy read it."""
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="np") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    if path.suffix == ".npy":
        return {"arr_0": np.load(path, allow_pickle=False)}, {}
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}, {}


def expected_quantization(x):
    """Per-channel int8 (the defaults) from the finite values, as the CLI documents."""
    xw = x.astype(np.float32) if x.dtype == BF16 else x
    finite = np.where(np.isfinite(xw), xw, xw.dtype.type(0))
    scales, zps = gpuq.choose_qparams(finite, axis=0)
    return gpuq.quantize(xw, scales, zps, axis=0), scales, zps.astype(np.int8)


def check_quantized_output(src, out):
    """The CLI accepted ``src``: the oracle must read it too, and ``out`` must be right."""
    tensors, _ = oracle_load(src)
    got, _ = oracle_load(out)
    meta = json.loads(str(got.pop("__gpuq__"))) if "__gpuq__" in got else None
    expect = set()
    for name, x in tensors.items():
        if x.dtype.name in FLOATS and x.ndim >= 2:
            q, scales, zps = expected_quantization(x)
            assert same_bits(got[name], q), name
            assert got[name + ".scales"].tobytes() == scales.tobytes(), name
            assert got[name + ".zps"].tobytes() == zps.tobytes(), name
            expect |= {name, name + ".scales", name + ".zps"}
        else:
            assert same_bits(got[name], x), name
            expect.add(name)
    assert set(got) == expect
    if meta is not None:
        assert meta["format_version"] == 1


# -- base files ----------------------------------------------------------------------------

def base_tensors():
    rng = np.random.default_rng(11)
    return {"w": (rng.standard_normal((8, 16)) * 0.1).astype(np.float32),
            "h": (rng.standard_normal((4, 6)) * 0.1).astype(BF16),
            "ids": np.arange(3, dtype=np.int64),
            "n": np.ones(5, np.float32)}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_bases")
    t = base_tensors()
    safetensors_numpy.save_file(t, str(d / "in.safetensors"), metadata={"format": "pt"})
    npz = dict(t, h=t["h"].astype(np.float16))
    np.savez(d / "in.npz", **npz)
    np.save(d / "in.npy", t["w"])
    for fmt in ("safetensors", "npz"):
        for flags, tag in (([], "asym"), (["--dtype", "uint8", "--per-tensor"], "u8t"),
                           (["--symmetric", "--group-size", "4"], "symg")):
            code, _, err = gpuq_run("quantize", d / f"in.{fmt}", "-o", d / f"{tag}.{fmt}",
                                    "--min-size", "0", *flags)
            assert code == 0, err
    return d


@contextlib.contextmanager
def scratch():
    d = Path(tempfile.mkdtemp(prefix="gpuq-fuzz-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- mutations -----------------------------------------------------------------------------

def st_split(raw):
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def st_join(header, data, pad=True, length_delta=0):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return (len(text) + length_delta).to_bytes(8, "little", signed=False) + text + data


def flip_bits(raw, bits, header_end):
    b = bytearray(raw)
    for pos, in_header in bits:
        limit = header_end if in_header else len(raw)
        i = pos % max(limit, 1)
        b[i] ^= 1 << (pos % 8)
    return bytes(b)


SIZES = st.one_of(st.integers(0, 40), st.sampled_from([-1, 2**63, 2**64, 1.0, "3", None, True]))
shape_edit = st.one_of(
    st.tuples(st.just("drop"), st.integers(0, 3)),
    st.tuples(st.just("add"), SIZES),
    st.tuples(st.just("set"), st.integers(0, 3), SIZES),
    st.tuples(st.just("replace"), st.sampled_from([None, "x", [], {}, [[2]], 7])),
)


def edit_shape(shape, e):
    shape = list(shape)
    if e[0] == "drop" and shape:
        del shape[e[1] % len(shape)]
    elif e[0] == "add":
        shape.append(e[1])
    elif e[0] == "set" and shape:
        shape[e[1] % len(shape)] = e[2]
    elif e[0] == "replace":
        return e[1]
    return shape


#: Codes of the same element size: a header mis-typed this way still fits the bytes.
SAME_SIZE = {"I8": ["U8", "BOOL", "F8_E4M3"], "U8": ["I8", "BOOL"], "F32": ["I32", "U32"],
             "F16": ["BF16", "I16"], "BF16": ["F16", "U16"], "I64": ["F64", "U64"]}
header_edit = st.one_of(
    st.tuples(st.just("dtype"), st.sampled_from(ST_CODES + [3, None])),
    st.tuples(st.just("retype"), st.integers(0, 2)),
    st.tuples(st.just("shape"), shape_edit),
    st.tuples(st.just("offsets"), st.sampled_from(["swap", "shift", "big", "neg", "short", "text"]),
              st.integers(1, 64)),
    st.tuples(st.just("del_key"), st.sampled_from(["dtype", "shape", "data_offsets"])),
    st.tuples(st.just("del_tensor")),
    st.tuples(st.just("add_tensor"), st.sampled_from(ST_CODES[:12]), st.integers(0, 4)),
    st.tuples(st.just("metadata"), st.sampled_from([None, [], {"a": 1}, {"a": None},
                                                    {"gpuq": "{"}, {"gpuq": "[]"},
                                                    {"\ud800": "x"}, "text"])),
    st.tuples(st.just("entry"), st.sampled_from([None, [], "x", 1])),
)


def apply_header_edit(header, name, e):
    info = header.get(name)
    kind = e[0]
    if kind == "dtype":
        info["dtype"] = e[1]
    elif kind == "retype":
        options = SAME_SIZE[info["dtype"]]
        info["dtype"] = options[e[1] % len(options)]
    elif kind == "shape":
        info["shape"] = edit_shape(info["shape"], e[1])
    elif kind == "offsets":
        b, end = info["data_offsets"]
        info["data_offsets"] = {"swap": [end, b], "shift": [b + e[2], end + e[2]],
                                "big": [b, end + 2**40], "neg": [-e[2], end],
                                "short": [b], "text": [str(b), end]}[e[1]]
    elif kind == "del_key":
        del info[e[1]]
    elif kind == "del_tensor":
        del header[name]
    elif kind == "add_tensor":
        header["extra"] = {"dtype": e[1], "shape": [e[2]], "data_offsets": [0, e[2]]}
    elif kind == "metadata":
        header["__metadata__"] = e[1]
    elif kind == "entry":
        header[name] = e[1]
    return header


st_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 2**20), st.booleans()),
                                        min_size=1, max_size=4)),
    st.tuples(st.just("header"), st.sampled_from(["w", "h", "ids", "n"]), header_edit,
              st.booleans(), st.sampled_from([0, 0, 0, 1, -1, 8, 10**9])),
)


def mutate_safetensors(raw, m):
    if m[0] == "truncate":
        return raw[:int(len(raw) * m[1])]
    n = int.from_bytes(raw[:8], "little")
    if m[0] == "flip":
        return flip_bits(raw, m[1], 8 + n)
    header, data = st_split(raw)
    _, name, edit, pad, delta = m
    return st_join(apply_header_edit(header, name, edit), data, pad, delta)


def test_fuzz_quantize_safetensors(bases):
    raw = (bases / "in.safetensors").read_bytes()

    def check(m):
        with scratch() as d:
            src, out = d / "in.safetensors", d / "out.safetensors"
            src.write_bytes(mutate_safetensors(raw, m))
            if outcome(["quantize", src, "-o", out, "--min-size", "0"], out):
                check_quantized_output(src, out)

    run(check, st_mutation, 80)


# .npy members rebuilt with a chosen header, in a zip with correct CRCs

def npy_bytes(descr, fortran, shape, data, *, raw_header=None):
    header = raw_header if raw_header is not None else (
        "{'descr': %r, 'fortran_order': %r, 'shape': %r, }" % (descr, fortran, tuple(shape)))
    header = header.encode("latin1")
    pad = -(10 + len(header) + 1) % 64
    header += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


def npy_parts(member_bytes):
    f = io.BytesIO(member_bytes)
    np.lib.format.read_magic(f)
    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    return dtype.str, fortran, shape, member_bytes[f.tell():]


npy_edit = st.one_of(
    st.tuples(st.just("descr"), st.sampled_from(NPY_DESCRS)),
    st.tuples(st.just("shape"), shape_edit),
    st.tuples(st.just("fortran")),
    st.tuples(st.just("data"), st.integers(-8, 8)),
    st.tuples(st.just("raw"), st.sampled_from(["{}", "garbage", "{'descr': '<f4'}",
                                               "{'descr': '<f4', 'fortran_order': 1, 'shape': (2,)}",
                                               "__import__('os')"])),
)


def edit_member(member_bytes, e):
    descr, fortran, shape, data = npy_parts(member_bytes)
    if e[0] == "descr":
        descr = e[1]
    elif e[0] == "shape":
        shape = edit_shape(shape, e[1])
        if not isinstance(shape, list) or not all(isinstance(v, int) for v in shape):
            return npy_bytes(None, None, None, data, raw_header=(
                "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, shape)))
    elif e[0] == "fortran":
        fortran = not fortran
    elif e[0] == "data":
        data = data[:e[1]] if e[1] < 0 else data + bytes(e[1])
    elif e[0] == "raw":
        return npy_bytes(None, None, None, data, raw_header=e[1])
    return npy_bytes(descr, fortran, shape, data)


def rebuild_zip(src_zip, member, edit):
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(src_zip)) as zin, zipfile.ZipFile(out, "w") as zout, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the duplicate member is the point
        for info in zin.infolist():
            data = zin.read(info)
            name = info.filename
            if name == member:
                if edit[0] == "rename":
                    name = edit[1]
                elif edit[0] == "duplicate":
                    zout.writestr(name, data)
                else:
                    data = edit_member(data, edit)
            zout.writestr(name, data)
    return out.getvalue()


npz_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 2**20), st.booleans()),
                                        min_size=1, max_size=3)),
    st.tuples(st.just("member"), st.sampled_from(["w.npy", "h.npy", "ids.npy", "n.npy"]),
              st.one_of(npy_edit, st.tuples(st.just("rename"), st.sampled_from(["w", "x.npy",
                                                                                 "n.npy"])),
                        st.tuples(st.just("duplicate")))),
)


def mutate_zip(raw, m):
    if m[0] == "truncate":
        return raw[:int(len(raw) * m[1])]
    if m[0] == "flip":
        return flip_bits(raw, m[1], len(raw))
    return rebuild_zip(raw, m[1], m[2])


def test_fuzz_quantize_npz(bases):
    raw = (bases / "in.npz").read_bytes()

    def check(m):
        with scratch() as d:
            src, out = d / "in.npz", d / "out.npz"
            src.write_bytes(mutate_zip(raw, m))
            if outcome(["quantize", src, "-o", out, "--min-size", "0"], out):
                check_quantized_output(src, out)

    run(check, npz_mutation, 70)


def test_fuzz_quantize_npy(bases):
    raw = (bases / "in.npy").read_bytes()
    mutation = st.one_of(
        st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
        st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 2**20), st.booleans()),
                                            min_size=1, max_size=3)),
        st.tuples(st.just("edit"), npy_edit))

    def check(m):
        with scratch() as d:
            src, out = d / "in.npy", d / "out.npz"
            if m[0] == "truncate":
                data = raw[:int(len(raw) * m[1])]
            elif m[0] == "flip":
                data = flip_bits(raw, m[1], 128)
            else:
                data = edit_member(raw, m[1])
            src.write_bytes(data)
            if outcome(["quantize", src, "-o", out, "--min-size", "0"], out):
                check_quantized_output(src, out)

    run(check, mutation, 40)


# -- quantized files: mis-typed companions and edited metadata --------------------------------

meta_edit = st.one_of(
    st.tuples(st.just("version"), st.sampled_from([0, 2, 3, 99, "1", 1.0, None, True])),
    st.tuples(st.just("field"), st.sampled_from(["dtype", "symmetric", "axis", "group_size",
                                                 "source_dtype", "other"]),
              st.sampled_from([None, 0, 1, 2, 3, 4, -1, True, "int8", "uint8", "int4", 8, [],
                               [0, 1], [1, 0], [0, 0], [0, 5]])),
    st.tuples(st.just("drop_field"), st.sampled_from(["dtype", "symmetric", "axis", "group_size",
                                                      "source_dtype"])),
    st.tuples(st.just("drop_tensor")),
    st.tuples(st.just("rename_tensor"), st.sampled_from(["n", "w.scales", "ids", "zz"])),
)
quantized_edit = st.one_of(
    st.tuples(st.just("retype"), st.sampled_from(["w", "w.scales", "w.zps", "h", "h.scales"]),
              st.integers(0, 2)),
    st.tuples(st.just("reshape"), st.sampled_from(["w", "w.scales", "w.zps", "h.scales"]),
              st.sampled_from(["flat", "transpose", "add1", "split"])),
    st.tuples(st.just("meta"), st.sampled_from(["w", "h"]), meta_edit),
)


def edit_meta(meta, name, e):
    t = meta["tensors"]
    if e[0] == "version":
        if e[1] is None:
            del meta["format_version"]
        else:
            meta["format_version"] = e[1]
    elif e[0] == "field":
        t[name][e[1]] = e[2]
    elif e[0] == "drop_field":
        t[name].pop(e[1], None)
    elif e[0] == "drop_tensor":
        del t[name]
    elif e[0] == "rename_tensor":
        t[e[1]] = t.pop(name)
    return meta


def reshaped(shape, how):
    n = math.prod(shape)
    return {"flat": [n], "transpose": list(shape[::-1]), "add1": [*shape, 1],
            "split": [2, n // 2] if n % 2 == 0 and n else [n, 1]}[how]


def mutate_quantized_st(raw, e):
    header, data = st_split(raw)
    if e[0] == "retype":
        info = header.get(e[1])
        if info is None:
            return raw
        options = SAME_SIZE.get(info["dtype"], [info["dtype"]])
        info["dtype"] = options[e[2] % len(options)]
    elif e[0] == "reshape":
        info = header.get(e[1])
        if info is None:
            return raw
        info["shape"] = reshaped(info["shape"], e[2])
    else:
        meta = json.loads(header["__metadata__"]["gpuq"])
        header["__metadata__"]["gpuq"] = json.dumps(edit_meta(meta, e[1], e[2]))
    return st_join(header, data)


NPY_SAME_SIZE = {"|i1": ["|u1", "|b1"], "|u1": ["|i1", "|b1"], "<f4": ["<i4", "<u4"],
                 "<f2": ["<i2", "<u2"]}


def mutate_quantized_npz(raw, e):
    if e[0] in ("retype", "reshape"):
        member = e[1] + ".npy"
        names = zipfile.ZipFile(io.BytesIO(raw)).namelist()
        if member not in names:
            return raw

        def edit(data):
            descr, fortran, shape, payload = npy_parts(data)
            if e[0] == "retype":
                options = NPY_SAME_SIZE.get(descr, [descr])
                descr = options[e[2] % len(options)]
            else:
                shape = reshaped(list(shape), e[2])
            return npy_bytes(descr, fortran, shape, payload)
    else:
        member = "__gpuq__.npy"

        def edit(data):
            meta = json.loads(str(np.load(io.BytesIO(data))))
            buf = io.BytesIO()
            np.save(buf, np.array(json.dumps(edit_meta(meta, e[1], e[2]))))
            return buf.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info.filename, edit(data) if info.filename == member else data)
    return out.getvalue()


def check_dequantized_output(src, out):
    """The CLI dequantized ``src``: it must really be what its metadata says, and ``out`` right."""
    tensors, metadata = oracle_load(src)
    meta = json.loads(metadata["gpuq"] if src.suffix == ".safetensors"
                      else str(tensors.pop("__gpuq__")))
    # Versions 2 and 3 are supersets of 1: an int8/uint8 file relabelled reads the same.
    assert meta["format_version"] in (1, 2, 3)
    got, _ = oracle_load(out)
    companions = set()
    for name, s in meta["tensors"].items():
        assert set(s) <= {"dtype", "symmetric", "axis", "group_size", "source_dtype"}
        assert s["dtype"] in ("int8", "uint8") and isinstance(s["symmetric"], bool)
        q, scales = tensors[name], tensors[name + ".scales"]
        assert q.dtype == np.dtype(s["dtype"]) and scales.dtype == np.float32
        axis, g = s["axis"], s["group_size"]
        if axis is None:
            assert g is None and scales.shape in ((), (1,))
        elif isinstance(axis, list):  # several axes: version 3, no groups
            assert meta["format_version"] == 3 and g is None
            assert len(axis) >= 2 and axis == sorted(set(axis)) and max(axis) < q.ndim
            assert scales.shape == tuple(q.shape[k] for k in axis)
            axis = tuple(axis)
        elif g is None:
            assert scales.shape == (q.shape[axis],)
        else:
            assert scales.shape == tuple(-(-d // g) if i == axis else d
                                         for i, d in enumerate(q.shape))
        zps = tensors.get(name + ".zps")
        if s["symmetric"] and s["dtype"] == "int8":
            assert zps is None
        else:
            assert zps.dtype == q.dtype and zps.shape == scales.shape
        # The source dtype recorded in the file comes back (bfloat16 in, bfloat16 back).
        src_dtype = s.get("source_dtype")
        out_dtype = src_dtype if src_dtype in FLOATS else "float32"
        want = gpuq.dequantize(q, scales, zps, axis=axis, group_size=g, dtype=out_dtype)
        assert same_bits(got[name], want), name
        companions |= {name + ".scales", name + ".zps"}
    for name, x in tensors.items():
        if name not in meta["tensors"] and name not in companions:
            assert same_bits(got[name], x), name
    assert set(got) == set(tensors) - companions


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_fuzz_dequantize(bases, fmt):
    raws = {tag: (bases / f"{tag}.{fmt}").read_bytes() for tag in ("asym", "u8t", "symg")}
    mutate = mutate_quantized_st if fmt == "safetensors" else mutate_quantized_npz
    cases = st.tuples(st.sampled_from(sorted(raws)), quantized_edit)

    def check(case):
        tag, e = case
        with scratch() as d:
            src, out = d / f"in.{fmt}", d / f"out.{fmt}"
            src.write_bytes(mutate(raws[tag], e))
            if outcome(["dequantize", src, "-o", out], out):
                check_dequantized_output(src, out)

    run(check, cases, 60)


# -- property: random checkpoints through quantize and dequantize ------------------------------

@st.composite
def checkpoints(draw):
    n = draw(st.integers(1, 5))
    names = draw(st.lists(st.from_regex(r"[a-z]{1,3}(\.[0-9]{1,2}){0,2}", fullmatch=True),
                          min_size=n, max_size=n, unique=True))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tensors = {}
    for name in names:
        dtype = draw(st.sampled_from(["float32", "bfloat16", "float16", "float64", "int32",
                                      "uint8", "bool"]))
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
        x = np.asarray(rng.standard_normal(shape) * draw(st.sampled_from([1e-3, 0.05, 3.0])))
        tensors[name] = np.asarray(x.astype(BF16) if dtype == "bfloat16" else
                                   (x > 0) if dtype == "bool" else x.astype(dtype))
    flags = draw(st.sampled_from([[], ["--symmetric"], ["--dtype", "uint8"], ["--per-tensor"],
                                  ["--group-size", "3"], ["--axis", "-1"]]))
    return tensors, flags


def test_property_round_trip_safetensors():
    """Random checkpoints: quantize writes exactly the library's codes and parameters for the
    selected tensors (and the rest bit for bit) in a file the safetensors library reads byte
    for byte as it would write it; dequantize gives the library's dequantization."""
    def check(case):
        tensors, flags = case
        with scratch() as d:
            src = d / "in.safetensors"
            safetensors_numpy.save_file(tensors, str(src))
            code, out, err = gpuq_run("quantize", src, "-o", d / "q.safetensors",
                                      "--min-size", "0", *flags)
            if code == 2:  # no floating tensor of rank >= 2, or --axis -1 on a 1-D one
                assert "no tensor to quantize" in err or "out of range" in err, err
                return
            assert code == 0, err
            with safe_open(str(d / "q.safetensors"), framework="np") as f:
                q = {k: f.get_tensor(k) for k in f.keys()}
                meta = f.metadata()
            schemes = json.loads(meta["gpuq"])["tensors"]
            safetensors_numpy.save_file(q, str(d / "oracle.safetensors"), metadata=meta)
            assert (d / "q.safetensors").read_bytes() == (d / "oracle.safetensors").read_bytes()
            for name, x in tensors.items():
                if name not in schemes:
                    assert same_bits(q[name], x)
                    continue
                s = schemes[name]
                xw = x.astype(np.float32) if x.dtype == BF16 else x
                axis = tuple(s["axis"]) if isinstance(s["axis"], list) else s["axis"]
                kw = dict(axis=axis, group_size=s["group_size"])
                scales, zps = gpuq.choose_qparams(xw, dtype=s["dtype"],
                                                  symmetric=s["symmetric"], **kw)
                assert same_bits(q[name], gpuq.quantize(xw, scales, zps, dtype=s["dtype"], **kw))
                assert q[name + ".scales"].tobytes() == scales.tobytes()
                if zps is not None:
                    assert q[name + ".zps"].tobytes() == zps.astype(s["dtype"]).tobytes()
            code, _, err = gpuq_run("dequantize", d / "q.safetensors", "-o", d / "b.safetensors")
            assert code == 0, err
            check_dequantized_output(d / "q.safetensors", d / "b.safetensors")

    run(check, checkpoints(), 25)
