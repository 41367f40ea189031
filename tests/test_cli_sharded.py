"""Sharded checkpoints (a folder of shards + ``model.safetensors.index.json``), here and on Dask.

The promise checked everywhere: an output shard is byte for byte the file a
one-file ``gpuq quantize SHARD`` (``dequantize``) writes with the same
options, whether the shards ran here, on a ``distributed.LocalCluster`` of
worker processes, or on one whose worker was killed mid-shard; the index
names exactly what the shards hold; and a failure leaves no index and no
shard. The cluster tests share one module-scoped cluster of 2 worker
processes (plus one ``--workers 2`` run through the real command line).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gpuq
from gpuq import cli
from gpuq.qparams import choose_qparams

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
INDEX = "model.safetensors.index.json"
OPTIONS = ["--group-size", "32", "--device", "cpu", "-q"]


def shard_name(i, n):
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def make_sharded(folder: Path, n_shards=3, seed=0, rows=64) -> dict:
    """A small sharded checkpoint: each shard a float32 and a bfloat16 matrix and a bias."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(n_shards):
        shard = shard_name(i, n_shards)
        t = {f"model.layers.{i}.mlp.weight": rng.standard_normal((rows, 128)).astype(np.float32),
             f"model.layers.{i}.attn.weight":
                 (rng.standard_normal((rows, 64)) * 0.1).astype(ml_dtypes.bfloat16),
             f"model.layers.{i}.norm.bias": rng.standard_normal(rows).astype(np.float32)}
        safetensors_numpy.save_file(t, str(folder / shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in t})
    index = {"metadata": {"total_size": 0, "note": "kept"}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index))
    return weight_map


def load(path):
    with safe_open(str(path), framework="np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def tensor_hashes(folder: Path) -> dict:
    """name -> sha256 of dtype, shape and bytes, over every shard of ``folder``'s index."""
    index = json.loads((folder / INDEX).read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        for name, arr in load(folder / shard).items():
            h = hashlib.sha256(f"{arr.dtype}{arr.shape}".encode())
            h.update(np.ascontiguousarray(arr).tobytes())
            out[name] = h.hexdigest()
    return out


def file_bytes(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def gpuq_main(*args):
    return cli.main([str(a) for a in args])


def per_file(command, src: Path, dst: Path, *options):
    """The reference: one ``gpuq COMMAND`` per shard file."""
    dst.mkdir()
    for shard in sorted(p.name for p in src.glob("*.safetensors")):
        assert gpuq_main(command, src / shard, "-o", dst / shard, *options) == 0


def check_index(out: Path, src_index: dict):
    """The output index lists exactly what the shards hold, and the bytes they hold."""
    index = json.loads((out / INDEX).read_text())
    held, total = {}, 0
    for shard in sorted(set(src_index["weight_map"].values())):
        with safe_open(str(out / shard), framework="np") as f:
            for name in f.keys():
                held[name] = shard
                t = f.get_tensor(name)
                total += t.nbytes
    assert index["weight_map"] == held
    assert list(index["weight_map"]) == sorted(held)
    assert index["metadata"] == {**src_index["metadata"], "total_size": total}
    return index


# -- here: quantize and dequantize ----------------------------------------------------

def test_quantize_is_the_per_file_run_byte_for_byte(tmp_path, capsys):
    wm = make_sharded(tmp_path / "in")
    per_file("quantize", tmp_path / "in", tmp_path / "ref", *OPTIONS)
    capsys.readouterr()
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "out", *OPTIONS,
                     "--json") == 0
    report = json.loads(capsys.readouterr().out)
    ref, got = file_bytes(tmp_path / "ref"), file_bytes(tmp_path / "out")
    assert set(got) == set(ref) | {INDEX}
    for shard in ref:
        assert got[shard] == ref[shard], shard
    index = check_index(tmp_path / "out", json.loads((tmp_path / "in" / INDEX).read_text()))
    for name in wm:
        if name.endswith("weight"):  # the companions sit in their codes' shard
            assert index["weight_map"][name + ".scales"] == wm[name]
            assert index["weight_map"][name + ".zps"] == wm[name]
    # One report over the whole model, and the codes are the library's.
    assert report["shards"] == 3 and report["total"]["tensors"] == len(wm)
    assert [r["name"] for r in report["tensors"]][:2] == ["model.layers.0.attn.weight",
                                                         "model.layers.0.mlp.weight"]
    x = load(tmp_path / "in" / wm["model.layers.1.mlp.weight"])["model.layers.1.mlp.weight"]
    s, z = choose_qparams(x, axis=1, group_size=32)
    q = load(tmp_path / "out" / wm["model.layers.1.mlp.weight"])
    assert np.array_equal(q["model.layers.1.mlp.weight"],
                          gpuq.quantize(x, s, z, axis=1, group_size=32))
    # The index file names the same thing as the folder.
    assert gpuq_main("quantize", tmp_path / "in" / INDEX, "-o", tmp_path / "out2",
                     *OPTIONS) == 0
    assert tensor_hashes(tmp_path / "out2") == tensor_hashes(tmp_path / "out")


def test_dequantize_sharded_is_the_per_file_run(tmp_path, capsys):
    make_sharded(tmp_path / "in")
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "q", *OPTIONS) == 0
    per_file("dequantize", tmp_path / "q", tmp_path / "ref", "--dtype", "float16", "-q")
    assert gpuq_main("dequantize", tmp_path / "q" / INDEX, "-o", tmp_path / "out",
                     "--dtype", "float16", "-q") == 0
    ref, got = file_bytes(tmp_path / "ref"), file_bytes(tmp_path / "out")
    assert {k: v for k, v in got.items() if k != INDEX} == ref
    index = check_index(tmp_path / "out", json.loads((tmp_path / "q" / INDEX).read_text()))
    assert not [n for n in index["weight_map"] if n.endswith((".scales", ".zps"))]
    assert "restored 6, kept 3" in capsys.readouterr().out


# -- failures leave no index and no shard ---------------------------------------------

def _fail_in(monkeypatch, shard, exc):
    from gpuq.checkpoints import files

    orig = files._SafetensorsWriter._write

    def write(self, name, arr):
        if os.path.basename(self.path).endswith(shard):  # its staged name
            raise exc
        return orig(self, name, arr)

    monkeypatch.setattr(files._SafetensorsWriter, "_write", write)


@pytest.mark.parametrize("exc, code", [(OSError(28, "No space left on device"), 2),
                                       (KeyboardInterrupt(), 130)])
def test_failure_in_the_second_shard_leaves_out_as_it_was(tmp_path, monkeypatch, capsys, exc,
                                                          code):
    make_sharded(tmp_path / "in")
    out = tmp_path / "out"
    assert gpuq_main("quantize", tmp_path / "in", "-o", out, *OPTIONS) == 0  # an earlier run
    before = file_bytes(out)
    capsys.readouterr()
    _fail_in(monkeypatch, shard_name(1, 3), exc)
    assert gpuq_main("quantize", tmp_path / "in", "-o", out, *OPTIONS, "--symmetric") == code
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("gpuq: ")
    # The first shard (complete) was never put in place: the earlier run's index and shards
    # are as they were, and no staged or temporary file is left.
    assert file_bytes(out) == before
    out2 = tmp_path / "fresh"
    assert gpuq_main("quantize", tmp_path / "in", "-o", out2, *OPTIONS) == code
    assert not out2.exists()  # created by the run, removed with it


def _rewrite_index(folder, fn):
    index = json.loads((folder / INDEX).read_text())
    fn(index)
    (folder / INDEX).write_text(json.dumps(index))


def _dup_key(folder):
    text = (folder / INDEX).read_text()
    name = "model.layers.0.mlp.weight"
    dup = f'"{name}": "{shard_name(0, 3)}", '
    (folder / INDEX).write_text(text.replace('"weight_map": {', '"weight_map": {' + dup, 1))


BROKEN = {
    "missing shard": (lambda f: (f / shard_name(2, 3)).unlink(), "does not exist"),
    "tensor listed twice": (_dup_key, "listed twice"),
    "tensor the shard lacks": (lambda f: _rewrite_index(f, lambda i: i["weight_map"].update(
        {"ghost.weight": shard_name(0, 3)})), "which does not hold it"),
    "tensor mapped to another shard": (lambda f: _rewrite_index(f, lambda i: i["weight_map"].update(
        {"model.layers.0.mlp.weight": shard_name(1, 3)})), "puts in"),
    "tensor not in the weight_map": (lambda f: _rewrite_index(f, lambda i: i["weight_map"].pop(
        "model.layers.2.norm.bias")), "not in the weight_map"),
    "shard outside the folder": (lambda f: _rewrite_index(f, lambda i: i["weight_map"].update(
        {"model.layers.0.mlp.weight": "../x.safetensors"})), "file name beside the index"),
    "no index": (lambda f: (f / INDEX).unlink(), "exactly one"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_index_is_one_line(tmp_path, capsys, case):
    break_it, words = BROKEN[case]
    make_sharded(tmp_path / "in")
    break_it(tmp_path / "in")
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "out", *OPTIONS) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("gpuq: error: ") and words in err
    assert not (tmp_path / "out").exists()


def test_dequantize_refuses_an_unquantized_shard(tmp_path, capsys):
    make_sharded(tmp_path / "in")
    assert gpuq_main("dequantize", tmp_path / "in", "-o", tmp_path / "out", "-q") == 2
    assert "no gpuq metadata" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cluster_flags_without_dask_or_shards(tmp_path, monkeypatch, capsys):
    make_sharded(tmp_path / "in")
    one = tmp_path / "in" / shard_name(0, 3)
    assert gpuq_main("quantize", one, "-o", tmp_path / "o.safetensors", "--workers", "2") == 2
    assert "one file" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "out", "--workers", "2") == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "pip install 'gpuq[dask]'" in err
    assert not (tmp_path / "out").exists()


# -- on a real cluster: 2 worker processes ------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    import logging

    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address="127.0.0.1:0",
                                  silence_logs=logging.ERROR) as c:
        yield c


def test_cluster_run_is_the_local_run(tmp_path, cluster):
    make_sharded(tmp_path / "in", n_shards=4)
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "local", *OPTIONS) == 0
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "dask", *OPTIONS,
                     "--scheduler", cluster.scheduler_address) == 0
    assert file_bytes(tmp_path / "dask") == file_bytes(tmp_path / "local")
    assert tensor_hashes(tmp_path / "dask") == tensor_hashes(tmp_path / "local")


@pytest.mark.parametrize("flags", [["--dtype", "int4", "--symmetric"],
                                   ["--dtype", "float4_e2m1fn", "--scales", "nvfp4"]])
def test_cluster_run_takes_the_scale_rule(tmp_path, cluster, flags):
    """The schemes a worker gets carry the scale rule: symmetric int4 by the full-range rule
    (max|x| / 7.5) and NVFP4's global scales, the same bytes as the local run."""
    make_sharded(tmp_path / "in", n_shards=2)
    opts = ["--device", "cpu", "-q", *flags]
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "local", *opts) == 0
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "dask", *opts,
                     "--scheduler", cluster.scheduler_address) == 0
    assert file_bytes(tmp_path / "dask") == file_bytes(tmp_path / "local")
    from gpuq.checkpoints.files import Checkpoint  # safetensors' NumPy loader has no F8 (NVFP4's scales)

    w = load(tmp_path / "in" / shard_name(0, 2))["model.layers.0.mlp.weight"]
    with Checkpoint(str(tmp_path / "dask" / shard_name(0, 2))) as ckpt:
        got = {n: ckpt.load(n) for n in ckpt.names}
    if flags[1] == "int4":
        want = (np.abs(w).max(axis=1) / np.float32(7.5)).astype(np.float32)  # one group of 128 a row
        assert got["model.layers.0.mlp.weight.scales"].reshape(-1).tobytes() == want.tobytes()
    else:
        assert got["model.layers.0.mlp.weight.global_scale"].tolist() == [gpuq.global_scale(w)]


def _kill_once(marker):
    """A worker plugin (pickled by value) whose worker exits at its first tensor write, once."""
    from distributed import WorkerPlugin

    class KillOnce(WorkerPlugin):
        def setup(self, worker):
            from gpuq.checkpoints import files

            orig = files._SafetensorsWriter._write

            def write(self, name, arr):
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return orig(self, name, arr)
                os._exit(1)  # mid-shard: its temporary file is left behind

            files._SafetensorsWriter._write = write

    return KillOnce()


def test_killed_worker_leaves_a_complete_identical_result(tmp_path, cluster):
    from distributed import Client

    make_sharded(tmp_path / "in", n_shards=4)
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "local", *OPTIONS) == 0
    marker = tmp_path / "killed"
    with Client(cluster) as client:
        client.register_plugin(_kill_once(str(marker)), name="gpuq-kill-once")
        try:
            assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "dask", *OPTIONS,
                             "--scheduler", cluster.scheduler_address) == 0
        finally:
            client.unregister_worker_plugin("gpuq-kill-once")
    assert marker.exists()  # a worker did die
    assert file_bytes(tmp_path / "dask") == file_bytes(tmp_path / "local")  # no .tmp left


def test_workers_flag_from_the_shell(tmp_path):
    pytest.importorskip("distributed")
    make_sharded(tmp_path / "in", n_shards=2)
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "local", *OPTIONS) == 0
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "gpuq", "quantize", str(tmp_path / "in"),
                           "-o", str(tmp_path / "dask"), *OPTIONS, "--workers", "2", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    report = json.loads(proc.stdout)
    assert report["cluster"] == {"scheduler": None, "workers": 2} and report["device"] == "cpu"
    assert file_bytes(tmp_path / "dask") == file_bytes(tmp_path / "local")


def test_failed_cluster_run_waits_for_its_tasks(tmp_path, cluster):
    """--scheduler: the cluster outlives the run. A failing shard (an Inf under --nonfinite
    error, in its last tensor) stops the other tasks at their next tensor, and the client
    waits for them before removing the run's files: no shard lands in OUT once the command
    has returned."""
    from distributed import Client

    from test_cli_stop import SLOW_GPUQ, poison

    make_sharded(tmp_path / "in", n_shards=3)
    poison(tmp_path / "in" / shard_name(0, 3), np.inf)
    (tmp_path / "slow_gpuq.py").write_text(SLOW_GPUQ)
    env = {"SLOW_MARKER": str(tmp_path / "marker"), "SLOW_WHEN": "write", "SLOW_DELAY": "0.2"}

    def slow_writes():  # on each worker: the script's patch of the writer
        os.environ.update(env)
        sys.path.insert(0, str(tmp_path))
        import slow_gpuq  # noqa: F401

    def restore():
        from gpuq.checkpoints import files

        slow = sys.modules.pop("slow_gpuq", None)  # None: a worker its nanny restarted (a loaded machine)
        if slow is not None:
            files._SafetensorsWriter._write = slow._write

    def busy(dask_worker):
        return len(dask_worker.active_threads)

    with Client(cluster) as client:
        client.run(slow_writes)
        try:
            assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "out", *OPTIONS,
                             "--nonfinite", "error", "--scheduler",
                             cluster.scheduler_address) == 2
            deadline = time.monotonic() + 10
            while any(client.run(busy).values()) and time.monotonic() < deadline:
                time.sleep(0.05)  # a task the client did not wait for runs on: let it end
        finally:
            client.run(restore)
    assert (tmp_path / "marker").exists()  # shards were being written
    assert not (tmp_path / "out").exists()
