"""The CLI's files: streamed reads and writes, held to the safetensors library, the umask, the
same bytes every run, clean errors on a full disk, and memory that does not grow with the file.

The safetensors library is the oracle: what gpuq writes must be byte for byte
what ``safetensors.numpy.save_file`` writes for the same tensors (when at most
one metadata key leaves the library's order no choice), and what gpuq reads
must equal ``load_file``. Write errors are tried three ways: an ``ENOSPC``
injected into the writes, a real kernel limit (``RLIMIT_FSIZE``) in a
subprocess, and, where user namespaces allow it, a real 64 KiB tmpfs that fills up.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpuq import cli
from gpuq.checkpoints import files as cli_files

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

REPO = Path(__file__).resolve().parents[1]
BF16 = np.dtype(ml_dtypes.bfloat16)


def gpuq_main(*args):
    return cli.main([*map(str, args), "--device", "cpu", "-q"])


def sample_tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "model.layers.0.w": rng.standard_normal((40, 24)).astype(BF16),
        "model.layers.10.w": rng.standard_normal((3, 8, 24)).astype(np.float16),
        "model.layers.2.w": rng.standard_normal((32, 33)).astype(np.float32),
        "f64": rng.standard_normal((5, 3)),
        "ids": np.arange(7, dtype=np.int64),
        "mask": rng.random(5) > 0.5,
        "u8": np.arange(9, dtype=np.uint8).reshape(3, 3),
        "i16": np.arange(-3, 3, dtype=np.int16),
        "u32": np.arange(3, dtype=np.uint32),
        "scalar": np.array(1.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
    }


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_writer_is_the_library_byte_for_byte(tmp_path, metadata):
    tensors = sample_tensors()
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    cli_files.write_checkpoint(str(ours), "safetensors", tensors, None, metadata)
    safetensors_numpy.save_file(tensors, str(theirs), metadata=metadata)
    assert ours.read_bytes() == theirs.read_bytes()
    back = safetensors_numpy.load_file(str(ours))
    assert back.keys() == tensors.keys() and all(same_bits(back[k], tensors[k]) for k in back)


def test_streamed_writes_in_any_order(tmp_path):
    """Tensors written one by one, out of order, land where the header says (the header is
    computed first); each data offset is aligned to its dtype."""
    from safetensors import safe_open

    tensors = sample_tensors(1)
    # float8 too: the safetensors library's NumPy side cannot hold it, gpuq reads it back.
    f8 = np.linspace(-2, 2, 7).astype(ml_dtypes.float8_e4m3fn)
    entries = {k: (v.shape, v.dtype) for k, v in {**tensors, "f8": f8}.items()}
    out = tmp_path / "o.safetensors"
    with cli_files.checkpoint_writer(str(out), "safetensors", entries,
                                     meta={"format_version": 1, "tensors": {}},
                                     extra_metadata={"z": "1", "a": "2"}) as w:
        w.write("f8", f8)
        for name in reversed(list(tensors)):
            w.write(name, tensors[name])
    with safe_open(str(out), framework="np") as f:
        assert all(same_bits(f.get_tensor(k), tensors[k]) for k in tensors)
    with cli_files.Checkpoint(str(out)) as ckpt:
        assert same_bits(ckpt.load("f8"), f8)
        assert all(same_bits(ckpt.load(k), tensors[k]) for k in tensors)
    raw = out.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert list(header["__metadata__"]) == ["a", "gpuq", "z"]  # sorted: the same bytes each run
    for name, info in header.items():
        if name != "__metadata__":
            assert info["data_offsets"][0] % entries[name][1].itemsize == 0


def test_writer_refuses_what_was_not_declared(tmp_path):
    out = tmp_path / "o.safetensors"
    with pytest.raises(RuntimeError, match="never written"):
        with cli_files.checkpoint_writer(str(out), "safetensors",
                                         {"a": ((2,), np.float32), "b": ((2,), np.int8)}) as w:
            w.write("a", np.zeros(2, np.float32))
    with pytest.raises(RuntimeError, match="declared float32"):
        with cli_files.checkpoint_writer(str(out), "safetensors", {"a": ((2,), np.float32)}) as w:
            w.write("a", np.zeros(2, np.float64))
    assert os.listdir(tmp_path) == []


def test_reader_is_the_library(tmp_path):
    tensors = sample_tensors(2)
    path = tmp_path / "t.safetensors"
    safetensors_numpy.save_file(tensors, str(path), metadata={"b": "1", "a": "x"})
    with cli_files.Checkpoint(str(path)) as ckpt:
        assert set(ckpt.names) == set(tensors) and ckpt.extra_metadata == {"a": "x", "b": "1"}
        for name in tensors:
            assert ckpt.spec(name) == (tensors[name].shape, tensors[name].dtype)
            assert same_bits(ckpt.load(name), tensors[name])
    npz = {k: v for k, v in tensors.items() if v.dtype != BF16}
    npz["fortran"] = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    np.savez(tmp_path / "t.npz", **npz)
    np.savez_compressed(tmp_path / "tc.npz", **npz)
    for path in ("t.npz", "tc.npz"):
        with cli_files.Checkpoint(str(tmp_path / path)) as ckpt:
            assert ckpt.names == list(npz)
            for name in npz:
                got = ckpt.load(name)
                assert same_bits(np.ascontiguousarray(got), np.ascontiguousarray(npz[name]))
                assert got.flags.f_contiguous == npz[name].flags.f_contiguous
    np.save(tmp_path / "t.npy", npz["fortran"])
    with cli_files.Checkpoint(str(tmp_path / "t.npy")) as ckpt:
        assert np.array_equal(ckpt.load("arr_0"), npz["fortran"])


def test_quantized_output_equals_the_library_oracle(tmp_path):
    """What quantize writes loads with the library, and equals what the library writes for
    the same tensors (bytes: one metadata key leaves the library no order to choose)."""
    tensors = sample_tensors(3)
    src = tmp_path / "in.safetensors"
    safetensors_numpy.save_file(tensors, str(src))
    assert gpuq_main("quantize", src, "-o", tmp_path / "q.safetensors", "--min-size", "0",
                     "--exclude", "scalar", "--json") == 0
    back = safetensors_numpy.load_file(str(tmp_path / "q.safetensors"))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "q.safetensors"), framework="np") as f:
        metadata = f.metadata()
    safetensors_numpy.save_file(back, str(tmp_path / "oracle.safetensors"), metadata=metadata)
    assert (tmp_path / "q.safetensors").read_bytes() == (tmp_path / "oracle.safetensors").read_bytes()
    assert set(json.loads(metadata["gpuq"])["tensors"]) == {
        "model.layers.0.w", "model.layers.10.w", "model.layers.2.w", "f64", "empty"}


# -- modes, determinism ------------------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_outputs_follow_the_umask(tmp_path, umask):
    tensors = {"w": np.ones((32, 40), np.float32), "b": np.ones(3, np.float32)}
    safetensors_numpy.save_file(tensors, str(tmp_path / "in.safetensors"))
    np.savez(tmp_path / "in.npz", w=tensors["w"])
    old = os.umask(umask)
    try:
        runs = [("quantize", "in.safetensors", "q.safetensors"),
                ("dequantize", "q.safetensors", "b.safetensors"),
                ("quantize", "in.npz", "q.npz"),
                ("dequantize", "q.npz", "b.npy")]
        for cmd, src, dst in runs:
            assert gpuq_main(cmd, tmp_path / src, "-o", tmp_path / dst, "--json") == 0
    finally:
        os.umask(old)
    for _, _, dst in runs:
        assert (tmp_path / dst).stat().st_mode & 0o777 == 0o666 & ~umask, dst


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_same_input_same_bytes(tmp_path, fmt):
    """Twice the same command, twice the same bytes (the input carries several metadata keys,
    which the library used to write in a random order)."""
    tensors = {"b.w": np.random.default_rng(0).standard_normal((40, 32)).astype(np.float32),
               "a.w": np.random.default_rng(1).standard_normal((40, 32)).astype(BF16 if fmt ==
                                                                                 "safetensors"
                                                                                 else np.float16),
               "bias": np.ones(3, np.float32)}
    src = tmp_path / f"in.{fmt}"
    if fmt == "safetensors":
        safetensors_numpy.save_file(tensors, str(src), metadata={
            "format": "pt", "model": "x", "revision": "3", "author": "a", "license": "mit",
            "step": "100"})
    else:
        np.savez(src, **tensors)
    hashes = {}
    for run in range(2):
        for cmd, a, b in (("quantize", f"in.{fmt}", f"q{run}.{fmt}"),
                          ("dequantize", f"q{run}.{fmt}", f"b{run}.{fmt}")):
            assert gpuq_main(cmd, tmp_path / a, "-o", tmp_path / b, "--json") == 0
            hashes[cmd, run] = sha(tmp_path / b)
    assert hashes["quantize", 0] == hashes["quantize", 1]
    assert hashes["dequantize", 0] == hashes["dequantize", 1]


def test_report_rows_in_natural_order(tmp_path, capsys):
    names = ["layers.10.w", "layers.2.w", "layers.1.w", "embed", "layers.2.a"]
    tensors = {n: np.ones((32, 32), np.float32) for n in names}
    safetensors_numpy.save_file(tensors, str(tmp_path / "in.safetensors"))
    want = ["embed", "layers.1.w", "layers.2.a", "layers.2.w", "layers.10.w"]
    assert gpuq_main("quantize", tmp_path / "in.safetensors", "-o", tmp_path / "q.safetensors",
                     "--json") == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["tensors"]] == want
    assert gpuq_main("quantize", tmp_path / "in.safetensors", "-o", tmp_path / "t.safetensors") == 0
    table = [line.split()[0] for line in capsys.readouterr().out.splitlines()[4:9]]
    assert table == want
    assert gpuq_main("dequantize", tmp_path / "q.safetensors", "-o", tmp_path / "b.safetensors",
                     "--json") == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["tensors"]] == want


# -- a full disk -------------------------------------------------------------------------------

def _assert_clean_failure(code, err, directory, before, words):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("gpuq: error: cannot write OUT") and words in lines[0], lines[0]
    assert sorted(os.listdir(directory)) == before


@pytest.mark.parametrize("where", ["preallocate", "third write"])
def test_disk_full_injected(tmp_path, monkeypatch, capsys, where):
    """ENOSPC from the reservation of the whole file, or from a write half-way through."""
    tensors = {f"l{i}.w": np.ones((32, 32), np.float32) for i in range(4)}
    safetensors_numpy.save_file(tensors, str(tmp_path / "in.safetensors"))
    calls = []

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def pwrite(fd, data, offset):
        calls.append(len(data))
        if len(calls) == 3:
            full()
        return os.write(fd, data) if os.lseek(fd, offset, os.SEEK_SET) >= 0 else 0

    if where == "preallocate":
        monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    else:
        monkeypatch.setattr(os, "pwrite", pwrite)
    before = sorted(os.listdir(tmp_path))
    code = gpuq_main("quantize", tmp_path / "in.safetensors", "-o", tmp_path / "q.safetensors")
    _assert_clean_failure(code, capsys.readouterr().err, tmp_path, before,
                          "No space left on device")
    assert where == "preallocate" or len(calls) == 3


def _subprocess(args, cwd, preexec=None, wrapper=()):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1",
               GPUQ_HOST_KERNELS="numpy")  # no numba cache written under the limit
    return subprocess.run([*wrapper, sys.executable, "-m", "gpuq", *map(str, args), "--device",
                           "cpu", "-q"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=preexec)


@pytest.mark.parametrize("cmd,src,dst,words", [
    ("quantize", "in.safetensors", "q.safetensors", "File too large"),
    ("quantize", "in.npz", "q.npz", "File too large"),
    ("dequantize", "q1.npz", "b.npy", ""),  # NumPy's tofile may say "N requested and M written"
    ("dequantize", "q1.safetensors", "b.safetensors", "File too large"),
])
def test_file_size_limit_is_one_line(tmp_path, cmd, src, dst, words):
    """A real write failure from the kernel (EFBIG past RLIMIT_FSIZE): one line, exit 2, no
    partial file, whatever the format (before issue 17: a SafetensorError traceback, exit 1)."""
    import resource
    import signal

    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    safetensors_numpy.save_file({"w": w}, str(tmp_path / "in.safetensors"))
    np.savez(tmp_path / "in.npz", w=w)
    for fmt in ("safetensors", "npz"):
        assert gpuq_main("quantize", tmp_path / f"in.{fmt}", "-o", tmp_path / f"q1.{fmt}",
                         "--json") == 0

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    before = sorted(os.listdir(tmp_path))
    proc = _subprocess([cmd, src, "-o", dst], tmp_path, preexec=limit)
    assert "Traceback" not in proc.stderr
    _assert_clean_failure(proc.returncode, proc.stderr, tmp_path, before, words)


def _unshare_tmpfs_works():
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_tmpfs_works(),
                    reason="needs user namespaces to mount a small tmpfs (unshare -rm)")
@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_small_filesystem_fills_up(tmp_path, fmt):
    """A real 64 KiB tmpfs (in a user and mount namespace) that the output does not fit."""
    w = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)
    src = tmp_path / f"in.{fmt}"
    if fmt == "safetensors":
        safetensors_numpy.save_file({"w": w}, str(src))
    else:
        np.savez(src, w=w)
    small = tmp_path / "small"
    small.mkdir()
    script = textwrap.dedent(f"""\
        mount -t tmpfs -o size=64k tmpfs {small} || exit 99
        "$@"; rc=$?
        echo "left: $(ls -A {small})" >&2
        exit $rc""")
    proc = _subprocess(["quantize", src, "-o", small / f"q.{fmt}"], tmp_path,
                       wrapper=("unshare", "-rm", "sh", "-c", script, "sh"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 2 and lines[0].startswith("gpuq: error: cannot write OUT"), proc.stderr
    assert "No space left on device" in lines[0]
    assert lines[1].strip() == "left:"  # no partial file, no temporary file


# -- memory --------------------------------------------------------------------------------------

_MEMORY_PROBE = """
import sys, numpy as np
from safetensors.numpy import save_file
from gpuq.cli import main
d = sys.argv[1]
save_file({"w": np.ones((64, 1024), np.float32)}, d + "/warm.safetensors")
rng = np.random.default_rng(0)
save_file({f"layers.{i}.w": rng.standard_normal((1024, 1024), dtype=np.float32)
           for i in range(16)}, d + "/big.safetensors")
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
flags = ["--device", "cpu", "-q", "--json"]
# Warm up: every module and compiled loop the measured runs use is loaded first.
assert main(["quantize", d + "/warm.safetensors", "-o", d + "/wq.safetensors", *flags]) == 0
assert main(["dequantize", d + "/wq.safetensors", "-o", d + "/wb.safetensors", *flags]) == 0
for cmd, src, dst in (("quantize", "big", "q"), ("dequantize", "q", "b")):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the current RSS
    start = status("VmRSS:")
    assert main([cmd, f"{d}/{src}.safetensors", "-o", f"{d}/{dst}.safetensors", *flags]) == 0
    print("growth", cmd, status("VmHWM:") - start, file=sys.stderr)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_memory_does_not_grow_with_the_file(tmp_path):
    """A 64 MiB checkpoint of 4 MiB tensors: the peak RSS of quantize and of dequantize grows
    by a few tensors, not by the file (before streaming: ~110 and ~80 MiB). The full-size
    measurement (~800 MB, /usr/bin/time -v) is bench/cli_memory.py."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    growth = {line.split()[1]: float(line.split()[2]) for line in proc.stderr.splitlines()
              if line.startswith("growth ")}
    assert growth["quantize"] < 40 and growth["dequantize"] < 40, growth
