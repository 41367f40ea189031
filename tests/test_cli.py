"""The ``gpuq`` command, driven as a user drives it: ``python -m gpuq ...`` in a subprocess.

Written tensors are checked against the library's own ``choose_qparams`` /
``quantize`` / ``dequantize`` with exact equality, the report's SQNR and max
error against a float64 computation done here, and every bad-input path for
exit code 2, its one-line message and the absence of any output file. Paths
that need to break something mid-run (Ctrl-C, a failing write) or fake the
environment (no bench package) call :func:`gpuq.cli.main` in-process.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuq
from gpuq import cli
from gpuq.qparams import choose_qparams
from report_rows import assert_same_rows

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BF16 = np.dtype(ml_dtypes.bfloat16)


def run_gpuq(*args, cwd):
    """``python -m gpuq ARGS`` in ``cwd``; returns the CompletedProcess (text)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "gpuq", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def rng_weight(rng, shape, dtype):
    return (rng.standard_normal(shape) * 0.05).astype(np.float32).astype(dtype)


def load_safetensors(path):
    with safe_open(str(path), framework="np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def load_npz(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def expected(x, *, axis, group_size=None, dtype="int8", symmetric=False):
    """What the CLI must write and report for ``x``, from the library and float64 numbers."""
    xw = x.astype(np.float32) if x.dtype == BF16 else x  # bfloat16 -> float32 is exact
    scales, zps = choose_qparams(xw, axis=axis, group_size=group_size, dtype=dtype,
                                 symmetric=symmetric)
    q = gpuq.quantize(xw, scales, zps, axis=axis, group_size=group_size, dtype=dtype)
    x_hat = gpuq.dequantize(q, scales, zps, axis=axis, group_size=group_size, dtype="float32")
    x64, d = xw.astype(np.float64), xw.astype(np.float64) - x_hat.astype(np.float64)
    signal, error = float(np.sum(x64 * x64)), float(np.sum(d * d))
    sqnr = math.inf if error == 0 else 10 * math.log10(signal / error)
    return {"q": q, "scales": scales, "zps": zps, "sqnr": sqnr,
            "max_err": float(np.max(np.abs(d))), "signal": signal, "error": error}


def check_row(row, exp, *, quantized_bytes):
    assert row["quantized"] is True
    assert row["bytes_after"] == quantized_bytes
    assert row["sqnr_db"] == pytest.approx(exp["sqnr"], rel=1e-9)
    assert row["max_abs_error"] == exp["max_err"]


# -- safetensors: bfloat16/float16/float32, asymmetric, the default schemes ------------------

#: The default int8 scheme of each tensor: one scale per row of the last dimension (axis 0 at
#: rank 2; every leading axis at rank 3, so each of the 4 "experts" has its own 8 scales).
DEFAULT_AXIS = {"layer.w_bf16": 0, "layer.w_f16": (0, 1), "layer.w_f32": 0}

@pytest.fixture(scope="module")
def st_case(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    rng = np.random.default_rng(1)
    tensors = {
        "layer.w_bf16": rng_weight(rng, (48, 40), BF16),
        "layer.w_f16": rng_weight(rng, (4, 8, 40), np.float16),
        "layer.w_f32": rng_weight(rng, (64, 33), np.float32),
        "layer.norm": rng_weight(rng, (40,), BF16),          # 1-D: kept
        "layer.small": rng_weight(rng, (10, 10), np.float32),  # < --min-size: kept
        "ids": np.arange(12, dtype=np.int64).reshape(3, 4),   # not floating: kept
    }
    tensors["layer.w_f32"][0, 0] = 0.0
    src = d / "model.safetensors"
    safetensors_numpy.save_file(tensors, str(src), metadata={"format": "pt"})
    q = run_gpuq("quantize", src, "-o", d / "q.safetensors", "--json", cwd=d)
    back = run_gpuq("dequantize", d / "q.safetensors", "-o", d / "back.safetensors", cwd=d)
    return d, tensors, q, back


def test_quantize_safetensors_writes_library_codes(st_case):
    d, tensors, proc, _ = st_case
    assert proc.returncode == 0, proc.stderr
    out, meta = load_safetensors(d / "q.safetensors")
    assert meta["format"] == "pt"  # the input's metadata passes through
    gpuq_meta = json.loads(meta["gpuq"])
    assert gpuq_meta["format_version"] == 3  # a multi-axis tensor: the version that has them
    scheme = gpuq_meta["tensors"]
    assert set(scheme) == {"layer.w_bf16", "layer.w_f16", "layer.w_f32"}
    for name in scheme:
        axis = DEFAULT_AXIS[name]
        exp = expected(tensors[name], axis=axis)
        assert scheme[name] == {"dtype": "int8", "symmetric": False,
                                "axis": list(axis) if isinstance(axis, tuple) else axis,
                                "group_size": None, "source_dtype": tensors[name].dtype.name}
        assert same_bits(out[name], exp["q"])
        assert same_bits(out[name + ".scales"], exp["scales"])
        assert same_bits(out[name + ".zps"], exp["zps"].astype(np.int8))  # zps in the code dtype
    for name in ("layer.norm", "layer.small", "ids"):
        assert same_bits(out[name], tensors[name])
    assert len(out) == 3 * 3 + 3


def test_quantize_report_matches_float64(st_case):
    d, tensors, proc, _ = st_case
    report = json.loads(proc.stdout)
    rows = {r["name"]: r for r in report["tensors"]}
    signal = error = 0.0
    for name in ("layer.w_bf16", "layer.w_f16", "layer.w_f32"):
        exp = expected(tensors[name], axis=DEFAULT_AXIS[name])
        n = exp["scales"].size  # 48, 4 * 8, 64
        check_row(rows[name], exp, quantized_bytes=tensors[name].size + 5 * n)
        assert rows[name]["bytes_before"] == tensors[name].nbytes
        assert rows[name]["shape"] == list(tensors[name].shape)
        signal, error = signal + exp["signal"], error + exp["error"]
    for name in ("layer.norm", "layer.small", "ids"):
        assert rows[name]["quantized"] is False and rows[name]["sqnr_db"] is None
        assert rows[name]["bytes_after"] == rows[name]["bytes_before"] == tensors[name].nbytes
    total = report["total"]
    assert (total["quantized"], total["kept"]) == (3, 3)
    assert total["bytes_before"] == sum(t.nbytes for t in tensors.values())
    assert total["bytes_after"] == sum(r["bytes_after"] for r in rows.values())
    assert total["sqnr_db"] == pytest.approx(10 * math.log10(signal / error), rel=1e-9)
    assert total["max_abs_error"] == max(r["max_abs_error"] for r in rows.values()
                                         if r["quantized"])


def test_dequantize_safetensors_round_trip(st_case):
    d, tensors, _, proc = st_case
    assert proc.returncode == 0, proc.stderr
    back, meta = load_safetensors(d / "back.safetensors")
    assert meta == {"format": "pt"}
    q, _ = load_safetensors(d / "q.safetensors")
    # Each tensor comes back in its source dtype (the default of --dtype).
    for name, dtype in (("layer.w_bf16", "bfloat16"), ("layer.w_f16", "float16"), ("layer.w_f32", "float32")):
        want = gpuq.dequantize(q[name], q[name + ".scales"], q[name + ".zps"],
                               axis=DEFAULT_AXIS[name], dtype=dtype)
        assert back[name].dtype.name == dtype and same_bits(back[name], want)
    for name in ("layer.norm", "layer.small", "ids"):  # bit for bit, bfloat16 included
        assert same_bits(back[name], tensors[name])
    assert set(back) == set(tensors)


# -- npz: per-group symmetric, patterns, float64; dequantize to float16 -------------------

def test_npz_group_symmetric(tmp_path):
    rng = np.random.default_rng(2)
    tensors = {
        "enc.a": rng_weight(rng, (32, 70), np.float32),
        "enc.b": rng_weight(rng, (16, 96), np.float64),
        "dec.c": rng_weight(rng, (40, 40), np.float16),
        "file": rng_weight(rng, (40, 40), np.float32),  # a name np.savez(**kw) cannot take
    }
    src = tmp_path / "w.npz"
    np.savez(src, **{k: v for k, v in tensors.items() if k != "file"})
    import zipfile

    with zipfile.ZipFile(src, "a") as zf, zf.open("file.npy", "w") as fh:
        np.lib.format.write_array(fh, tensors["file"])
    proc = run_gpuq("quantize", src, "-o", tmp_path / "q.npz", "--group-size", "16",
                    "--symmetric", "--include", "enc.*", "--include", "file",
                    "--exclude", "*.b", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = load_npz(tmp_path / "q.npz")
    meta = json.loads(str(out.pop("__gpuq__")))
    assert set(meta["tensors"]) == {"enc.a", "file"}
    rows = {r["name"]: r for r in json.loads(proc.stdout)["tensors"]}
    for name in ("enc.a", "file"):
        exp = expected(tensors[name], axis=-1, group_size=16, symmetric=True)
        assert exp["zps"] is None and name + ".zps" not in out  # symmetric int8: no zps
        assert same_bits(out[name], exp["q"])
        assert same_bits(out[name + ".scales"], exp["scales"])
        assert out[name + ".scales"].shape == (tensors[name].shape[0], -(-tensors[name].shape[1] // 16))
        check_row(rows[name], exp, quantized_bytes=exp["q"].nbytes + exp["scales"].nbytes)
        assert rows[name]["scheme"] == {"dtype": "int8", "symmetric": True, "axis": 1,
                                        "group_size": 16}
    for name in ("enc.b", "dec.c"):
        assert same_bits(out[name], tensors[name])

    proc = run_gpuq("dequantize", tmp_path / "q.npz", "-o", tmp_path / "back.npz",
                    "--dtype", "float16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    back = load_npz(tmp_path / "back.npz")
    assert set(back) == set(tensors)
    for name in ("enc.a", "file"):
        want = gpuq.dequantize(out[name], out[name + ".scales"], axis=1, group_size=16,
                               dtype="float16")
        assert same_bits(back[name], want)
    for name in ("enc.b", "dec.c"):
        assert same_bits(back[name], tensors[name])


# -- npy: a lone array -> .npz (arr_0), per-tensor uint8, table output; back to .npy --------

def test_npy_per_tensor_uint8_table(tmp_path):
    x = rng_weight(np.random.default_rng(3), (30, 50), np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = run_gpuq("quantize", tmp_path / "x.npy", "-o", tmp_path / "x.npz", "--per-tensor",
                    "--dtype", "uint8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = load_npz(tmp_path / "x.npz")
    exp = expected(x, axis=None, dtype="uint8")
    assert same_bits(out["arr_0"], exp["q"])
    assert same_bits(out["arr_0.scales"], exp["scales"]) and out["arr_0.scales"].shape == ()
    assert same_bits(out["arr_0.zps"], exp["zps"].astype(np.uint8))
    lines = proc.stdout.splitlines()
    assert lines[2].split() == ["tensor", "shape", "scheme", "before", "after", "SQNR", "dB",
                                "max", "abs", "err"]
    row = next(line for line in lines if line.startswith("arr_0 "))
    assert "30x50" in row and "uint8 asym per-tensor" in row
    assert row.split()[-2] == f"{exp['sqnr']:.2f}" and row.split()[-1] == f"{exp['max_err']:.3g}"
    assert lines[-1].startswith("total: 1 quantized, 0 kept")

    proc = run_gpuq("dequantize", tmp_path / "x.npz", "-o", tmp_path / "y.npy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    want = gpuq.dequantize(exp["q"], exp["scales"], exp["zps"])
    assert same_bits(np.load(tmp_path / "y.npy"), want)


# -- the README's offline example, gpuq info ------------------------------------------------

def test_example_then_info(tmp_path):
    proc = run_gpuq("example", "tiny.safetensors", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    t, meta = load_safetensors(tmp_path / "tiny.safetensors")
    assert len(t) == 22 and {v.dtype for v in t.values()} == {BF16}
    proc = run_gpuq("info", "--json", "--no-compile-check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["gpuq"] == gpuq.__version__
    assert {"backend", "gpu", "cupy", "cuda_runtime", "nvrtc", "kernels_compile", "host_kernels"} <= set(info)
    assert info["host_kernels"].split()[0] == gpuq.get_host_kernels()


def test_info_kernel_compile_check(monkeypatch):
    """The NVRTC part of gpuq info, with nvrtc_check faked (the real compile takes seconds)."""
    from types import SimpleNamespace

    from gpuq.checkpoints import env as cli_env
    from gpuq.backends.cuda import nvrtc_check, registry

    class FakeNvrtc:
        def __init__(self, path):
            pass

        def version(self):
            return (13, 5)

    def compile_source(nvrtc, source, target):
        return SimpleNamespace(ok=source != "broken.cu", names=["k1", "k2"],
                               describe=lambda: f"{source} [{target}] 2 kernels: FAILED\nerror")

    monkeypatch.setattr(nvrtc_check, "find_libnvrtc", lambda: Path("/x/libnvrtc.so.13"))
    monkeypatch.setattr(nvrtc_check, "Nvrtc", FakeNvrtc)
    monkeypatch.setattr(nvrtc_check, "compile_source", compile_source)
    monkeypatch.setattr(registry, "SOURCES", {"a.cu": None, "b.cu": None})
    report = {}
    cli_env._nvrtc_info(report)
    assert report["nvrtc"] == "13.5 (/x/libnvrtc.so.13)"
    assert report["kernels_compile"].startswith("yes (4 kernels in 2 sources, compute_80 PTX")
    monkeypatch.setattr(registry, "SOURCES", {"a.cu": None, "broken.cu": None})
    cli_env._nvrtc_info(report)
    assert report["kernels_compile"] == "no: broken.cu [compute_80] 2 kernels: FAILED error"
    monkeypatch.setattr(nvrtc_check, "find_libnvrtc", lambda: None)
    report = {}
    cli_env._nvrtc_info(report)
    assert report["nvrtc"].startswith("unavailable (libnvrtc not found")


# -- bad input: exit code 2, one line on stderr, no output left ----------------------------

@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    good = {"a.w": np.ones((32, 32), np.float32), "a.w.scales": np.ones(3, np.float32)}
    safetensors_numpy.save_file({"a.w": good["a.w"]}, str(d / "ok.safetensors"))
    safetensors_numpy.save_file(good, str(d / "clash.safetensors"))
    data = (d / "ok.safetensors").read_bytes()
    (d / "trunc.safetensors").write_bytes(data[: len(data) - 100])
    (d / "junk.npz").write_bytes(b"not a zip file at all")
    (d / "model.bin").write_bytes(b"")
    np.save(d / "one.npy", np.ones((32, 32), np.float32))
    (d / "afile").write_bytes(b"")
    cli.main(["quantize", str(d / "ok.safetensors"), "-o", str(d / "q.safetensors"), "-q", "--json",
              "--device", "cpu"])
    np.savez(d / "two.npz", a=np.ones((32, 32), np.float32), b=np.ones(3, np.float32))
    cli.main(["quantize", str(d / "two.npz"), "-o", str(d / "q2.npz"), "-q", "--json",
              "--device", "cpu"])
    return d


def _assert_failed(code, err, message, d, before):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuq: error: "), err
    assert message in lines[0]
    assert sorted(os.listdir(d)) == before  # no output, no temporary file


BAD = [
    (["quantize", "missing.safetensors", "-o", "o.safetensors"], "no such file"),
    (["quantize", "model.bin", "-o", "o.safetensors"], "unknown extension '.bin'"),
    (["quantize", "trunc.safetensors", "-o", "o.safetensors"], "cannot read IN 'trunc.safetensors'"),
    (["quantize", "junk.npz", "-o", "o.npz"], "cannot read IN 'junk.npz'"),
    (["quantize", "ok.safetensors", "-o", "afile/o.safetensors"], "is not a directory"),
    (["quantize", "ok.safetensors", "-o", "nodir/o.safetensors"], "does not exist"),
    (["quantize", "ok.safetensors", "-o", "o.npz"], "must be .safetensors"),
    (["quantize", "one.npy", "-o", "o.npy"], "must be .npz"),
    (["quantize", "ok.safetensors", "-o", "ok.safetensors"], "is the input file"),
    (["quantize", "ok.safetensors", "-o", "o.safetensors", "--include", "b.*"],
     "--include 'b.*' matches no tensor"),
    (["quantize", "ok.safetensors", "-o", "o.safetensors", "--exclude", "zzz"],
     "--exclude 'zzz' matches no tensor"),
    (["quantize", "ok.safetensors", "-o", "o.safetensors", "--min-size", "5000"],
     "no tensor to quantize"),
    (["quantize", "ok.safetensors", "-o", "o.safetensors", "--axis", "2"],
     "--axis 2 is out of range for tensor 'a.w'"),
    (["quantize", "ok.safetensors", "-o", "o.safetensors", "--per-tensor", "--group-size", "8"],
     "--group-size needs an axis"),
    (["quantize", "ok.safetensors", "-o", "o.safetensors", "--per-tensor", "--axis", "0"],
     "not allowed with argument --per-tensor"),
    (["quantize", "ok.safetensors", "-o", "o.safetensors", "--group-size", "0"],
     "--group-size must be a positive integer"),
    (["quantize", "clash.safetensors", "-o", "o.safetensors"], "already has a tensor named 'a.w.scales'"),
    (["dequantize", "ok.safetensors", "-o", "o.safetensors"], "has no gpuq metadata"),
    (["quantize", "q.safetensors", "-o", "o.safetensors"], "is already quantized by gpuq"),
    (["dequantize", "q2.npz", "-o", "o.npy"], "holds one array, but IN has 2 tensors"),
    (["dequantize", "q2.npz", "-o", "o.safetensors"], "must be .npy or .npz"),
    (["quantize", "ok.safetensors"], "the following arguments are required: -o/--output"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a[2:]) or a[0] for a, _ in BAD])
def test_bad_input_in_process(bad_dir, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(bad_dir)
    before = sorted(os.listdir(bad_dir))
    code = cli.main(argv)
    _assert_failed(code, capsys.readouterr().err, message, bad_dir, before)


@pytest.mark.parametrize("argv,message", [BAD[0], BAD[2]], ids=["missing", "truncated"])
def test_bad_input_subprocess(bad_dir, argv, message):
    before = sorted(os.listdir(bad_dir))
    proc = run_gpuq(*argv, cwd=bad_dir)
    _assert_failed(proc.returncode, proc.stderr, message, bad_dir, before)


def test_device_cuda_without_gpu(bad_dir, monkeypatch, capsys):
    from gpuq.checkpoints import env as cli_env

    monkeypatch.setattr(cli_env, "cuda_unavailable_reason", lambda: "CuPy is not installed")
    monkeypatch.chdir(bad_dir)
    before = sorted(os.listdir(bad_dir))
    code = cli.main(["quantize", "ok.safetensors", "-o", "o.safetensors", "--device", "cuda"])
    _assert_failed(code, capsys.readouterr().err, "--device cuda: CuPy is not installed",
                   bad_dir, before)
    assert cli_env.pick_device("auto").name == "cpu"  # auto falls back quietly


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError])
def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch, capsys, fmt, exc):
    """Ctrl-C or a failing write after part of OUT is written: no OUT, no temporary file."""
    from gpuq.checkpoints import files as cli_files

    src = tmp_path / f"x.{fmt}"
    tensors = {"a": np.ones((32, 32), np.float32), "b": np.full((32, 32), 2, np.float32)}
    if fmt == "safetensors":
        safetensors_numpy.save_file(tensors, str(src))
    else:
        np.savez(src, **tensors)
    real = cli_files._Writer.write
    calls = []

    def write(self, name, arr):
        calls.append(name)
        if len(calls) == 3:  # the header and two tensors are in the temporary file by now
            assert os.path.getsize(self.tmp) > 0
            raise exc("boom")
        return real(self, name, arr)

    monkeypatch.setattr(cli_files._Writer, "write", write)
    before = sorted(os.listdir(tmp_path))
    code = cli.main(["quantize", str(src), "-o", str(tmp_path / f"out.{fmt}"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert len(calls) == 3
    if exc is KeyboardInterrupt:
        assert code == 130 and "interrupted" in err
    else:  # an unexpected OSError on the way is a CliError only where files.py makes it one
        assert code == 2 and "cannot write OUT" in err
    assert sorted(os.listdir(tmp_path)) == before


# -- no gpuq bench ---------------------------------------------------------------------------

def test_bench_is_not_a_command(capsys):
    """The benchmark lives in the repository (``python -m bench``), not in the wheel, so an
    installed gpuq has no ``bench`` command: it is refused like any unknown command."""
    assert cli.main(["bench", "--device", "cpu"]) == 2
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_device_cuda_plumbing_with_fake_cupy(tmp_path, monkeypatch, capsys):
    """--device cuda moves each tensor through CuPy and back; with a NumPy stand-in for CuPy
    (no GPU here) the files must equal the --device cpu ones bit for bit."""
    import types

    from gpuq.checkpoints import env as cli_env

    fake = types.ModuleType("cupy")
    fake.ndarray = type("FakeCupyArray", (), {})
    fake.asarray, fake.asnumpy = np.asarray, np.asarray  # all the CLI itself may use
    rng = np.random.default_rng(4)
    np.savez(tmp_path / "w.npz", a=rng_weight(rng, (40, 64), np.float32),
             b=rng_weight(rng, (8,), np.float32))
    outs = {}
    for device in ("cpu", "cuda"):
        if device == "cuda":
            monkeypatch.setitem(sys.modules, "cupy", fake)
            monkeypatch.setattr(cli_env, "cuda_unavailable_reason", lambda: None)
        for cmd, src, dst in (("quantize", "w.npz", f"q_{device}.npz"),
                              ("dequantize", f"q_{device}.npz", f"b_{device}.npz")):
            argv = [cmd, str(tmp_path / src), "-o", str(tmp_path / dst), "--device", device,
                    "--json"]
            assert cli.main(argv) == 0
            report = json.loads(capsys.readouterr().out)
            assert report["device"] == device
            outs[cmd, device] = report, load_npz(tmp_path / dst)
    for cmd in ("quantize", "dequantize"):
        (rep_cpu, cpu), (rep_gpu, gpu) = outs[cmd, "cpu"], outs[cmd, "cuda"]
        assert_same_rows(rep_cpu["tensors"], rep_gpu["tensors"])  # the SQNR's sums in another order
        assert set(cpu) == set(gpu) and all(same_bits(cpu[k], gpu[k]) for k in cpu)


def test_info_exits_non_zero_when_nvrtc_is_here_but_the_kernels_do_not_compile(monkeypatch, capsys):
    from gpuq.backends.cuda import nvrtc_check, registry

    if nvrtc_check.find_libnvrtc() is None:
        pytest.skip("needs libnvrtc (the test extra)")
    # One small source compiled for real (every source is compiled by test_kernels_compile).
    monkeypatch.setattr(registry, "SOURCES", {"qparams.cu": registry.SOURCES["qparams.cu"]})
    assert cli.main(["info"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(registry, "source_text", lambda name: "this is not CUDA C++;\n")
    assert cli.main(["info"]) == 1
    out = capsys.readouterr().out
    assert "kernels compile  no:" in out and "nvrtc" in out


def test_info_without_nvrtc_says_so_and_exits_zero(monkeypatch, capsys):
    from gpuq.backends.cuda import nvrtc_check

    monkeypatch.setattr(nvrtc_check, "find_libnvrtc", lambda: None)
    assert cli.main(["info"]) == 0
    assert "libnvrtc not found" in capsys.readouterr().out


def test_dequantize_dtype_overrides_the_source_dtype(st_case, tmp_path):
    d, _, _, proc = st_case
    assert proc.returncode == 0, proc.stderr
    assert cli.main(["dequantize", str(d / "q.safetensors"), "-o", str(tmp_path / "f32.safetensors"),
                     "--dtype", "float32", "--device", "cpu", "-q"]) == 0
    back, _ = load_safetensors(tmp_path / "f32.safetensors")
    q, _ = load_safetensors(d / "q.safetensors")
    want = gpuq.dequantize(q["layer.w_bf16"], q["layer.w_bf16.scales"], q["layer.w_bf16.zps"], axis=0)
    assert back["layer.w_bf16"].dtype == np.float32 and same_bits(back["layer.w_bf16"], want)


def test_bfloat16_is_quantized_as_it_is():
    """No float32 copy of a bfloat16 tensor: the codes are gpuq's on the bfloat16 array."""
    from gpuq.checkpoints.convert import quantize_tensor
    from gpuq.checkpoints.env import HostDevice

    x = (np.random.default_rng(4).standard_normal((33, 65)) * 3).astype(ml_dtypes.bfloat16)
    scheme = {"dtype": "int8", "symmetric": False, "axis": 0, "group_size": None}
    q, s, z, _, _ = quantize_tensor(x.copy(), scheme, HostDevice())
    s2, z2 = gpuq.choose_qparams(x.astype(np.float32), axis=0)  # the exact widening: same parameters
    assert np.array_equal(s, s2) and np.array_equal(z, z2.astype(np.int8))
    assert np.array_equal(q, gpuq.quantize(x.astype(np.float32), s2, z2, axis=0))
