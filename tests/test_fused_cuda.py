"""The one-pass checkpoint weight on ``--device cuda`` (issue 40, point 1: ``kernels/weight_pass.cu``,
``gpuq.backends.cuda.weight_pass``, ``gpuq.checkpoints.fused_cuda``).

Without a GPU these run on the CPU execution of the kernels (tests/cudasim). Every
instantiation of weight_pass.cu is launched (the launch records prove it there) and its codes,
scales and zero points are compared with the host pass (``gpuq.backends.host.weight_pass``, itself
tested against the multi-pass path in tests/test_fused_weight.py) bit for bit on odd shapes,
bfloat16/float16/float32, NaN/Inf, all-zero, all-NaN and all-Inf rows; the figures' float64 sums
in the kernel's order within 1e-12, the maximum and the counts exactly. The run loop's two streams
and pinned buffers are checked on the stand-in's ordered queues.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba")

from conftest import CUDA_MODE, _cuda_skip_reason  # noqa: E402
from gpuq._codetypes import code_type  # noqa: E402
from gpuq.backends.cuda import registry  # noqa: E402
from gpuq.backends.cuda import weight_pass as cuda_pass  # noqa: E402
from gpuq.backends.host import weight_pass as host_pass  # noqa: E402
from gpuq.checkpoints import fused, fused_cuda  # noqa: E402
from gpuq.checkpoints.env import HostDevice  # noqa: E402
from gpuq.checkpoints.files import CliError  # noqa: E402
from gpuq.checkpoints.serving import quantize as serving  # noqa: E402
from test_fused_weight import SCHEMES, assert_same, numpy_figures, weight  # noqa: E402

_REASON = _cuda_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
_SIM = CUDA_MODE == "sim"

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [BF16, np.dtype(np.float16), np.dtype(np.float32)]
EPS = np.float32(np.finfo(np.float32).tiny)

#: (code, symmetric, scale dtype, group size or None, per tensor, shape) reaching each (kind, warp
#: team, per tensor) of the kernel: groups of <= 512 take a warp, longer rows a thread block;
#: symmetric 2 is the full-range rule; n = 77 and 1025 leave a row's last word part padding.
CASES = {
    (0, True, False): ("int4", 2, "bfloat16", 128, False, (5, 256)),
    (0, False, False): ("int8", 0, "float16", None, False, (3, 1025)),
    (0, True, True): ("int8", 1, "float32", None, True, (5, 77)),
    (0, False, True): ("int4", 0, "bfloat16", None, True, (3, 1025)),
    (1, True, False): ("float8_e4m3fn", 1, "bfloat16", None, False, (5, 77)),
    (1, False, False): ("float8_e4m3fn", 1, "float32", None, False, (3, 1025)),
    (1, True, True): ("float8_e4m3fn", 1, "float16", None, True, (5, 130)),
    (1, False, True): ("float8_e4m3fn", 1, "bfloat16", None, True, (3, 1025)),
    (2, True, False): ("float8_e5m2", 1, "float32", None, False, (6, 64)),
    (2, False, False): ("float8_e5m2", 1, "bfloat16", None, False, (3, 1025)),
    (2, True, True): ("float8_e5m2", 1, "float32", None, True, (5, 77)),
    (2, False, True): ("float8_e5m2", 1, "float16", None, True, (3, 1025)),
}


def _out(shape, code):
    rows, n = shape
    if code.codec == "float8":
        return np.full((rows, n), 0xAB, np.uint8)  # not zeros: every byte must be written
    return np.full((rows, -(-n * code.bits // 32)), 0xABABABAB, np.uint32)


def _both(x, code_name, symmetric, sdt, g, tensor):
    """The host pass's and the GPU pass's ``(results, codes)`` of the same call."""
    code = code_type(code_name)
    g = g or x.shape[1]
    o_host, o_gpu = _out(x.shape, code), _out(x.shape, code)
    want = host_pass.quantize_rows(x, code, symmetric, EPS, sdt, g, tensor, o_host)
    before = x.tobytes()
    got = fused_cuda.quantize_rows(x, code, symmetric, EPS, sdt, g, tensor, o_gpu)
    assert x.tobytes() == before  # the input is read, never written
    return (want, o_host), (got, o_gpu)


def assert_same_rows(want, got):
    (w, wo), (g, go) = want, got
    assert (w is None) == (g is None)
    if w is None:
        return
    assert wo.tobytes() == go.tobytes()  # the codes in their final layout
    assert w[0].tobytes() == g[0].tobytes()  # scales
    assert (w[1] is None and g[1] is None) or w[1].tobytes() == g[1].tobytes()  # zero points
    assert w[3] == g[3]  # NaN/Inf counts
    (ws, we, wm), (gs, ge, gm) = w[2], g[2]
    assert gm == wm
    assert gs == pytest.approx(ws, rel=1e-12, abs=0.0) and ge == pytest.approx(we, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: "kind{}-{}-{}".format(c[0], "warp" if c[1] else "block",
                                                                                   "tensor" if c[2] else "groups"))
def test_every_instantiation_is_the_host_pass(case, dtype):
    code, symmetric, sdt, g, tensor, shape = CASES[case]
    x = weight(shape, dtype)
    assert_same_rows(*_both(x, code, symmetric, sdt, g, tensor))
    if _SIM:  # the launch records: the case ran its kernel
        import cupy

        names = [r.name for r in cupy._sim.launches]
        name = registry.weight_pass_name(fused_cuda._dtype_name(dtype), *case)
        assert name in names
        assert (registry.weight_range_name(fused_cuda._dtype_name(dtype)) in names) == case[2]


def test_the_cases_reach_every_instantiation():
    reached = {registry.weight_pass_name(f, *c) for f in registry.WEIGHT_DTYPES for c in CASES}
    reached |= {registry.weight_range_name(f) for f in registry.WEIGHT_DTYPES}
    reached |= {registry.weight_blocks_name(fused_cuda._dtype_name(c[0]), 1 + registry.FP8_FMT[c[1]])
                for c in BLOCK_CASES}
    reached |= {registry.weight_micro_name(f) for f in registry.WEIGHT_DTYPES}  # tests/test_fused_cuda_micro.py
    assert reached == set(registry.SOURCES["weight_pass.cu"]())
    for (kind, warp, tensor), (code, _, _, g, _, (rows, n)) in CASES.items():  # each case is its kernel's
        p = cuda_pass.plan((rows, n), "float32", code_type(code), 1, EPS, "float32", g or n, tensor)
        assert (p.kind, p.warp, p.tensor) == (kind, warp, tensor)


@pytest.mark.parametrize("cap", [2, cuda_pass.MAX_BLOCKS])
def test_blocks_that_take_several_groups_in_turn(cap, monkeypatch):
    """12 x 2 groups on warps (24 teams, 3 blocks), and the grid capped at two blocks: each block's
    teams then take several groups one after the other, block teams too (3 rows of 1025)."""
    monkeypatch.setattr(cuda_pass, "MAX_BLOCKS", cap)
    x = weight((12, 256), BF16, seed=4)
    assert_same_rows(*_both(x, "int4", 2, "bfloat16", 128, False))
    x = weight((3, 1025), np.dtype(np.float32), seed=5)
    assert_same_rows(*_both(x, "float8_e4m3fn", 1, "float32", None, False))


@pytest.mark.skipif(not _SIM, reason="the fiber schedules of the CPU execution of the kernels")
def test_the_figures_do_not_depend_on_the_threads_order(monkeypatch):
    """Every fiber schedule gives the same figures, bit for bit: the partials meet in a fixed tree,
    not in the order threads finish (a missing barrier or an atomic float sum would show)."""
    import cupy

    monkeypatch.setattr(cuda_pass, "MAX_BLOCKS", 2)
    x = weight((12, 256), np.dtype(np.float32), seed=6)
    out = _out(x.shape, code_type("int4"))
    figures = set()
    for schedule in ("inorder", "reversed", "interleaved"):
        with cupy._sim.schedule(schedule):
            got = fused_cuda.quantize_rows(x, code_type("int4"), 0, EPS, "float32", 128, False, out)
        figures.add((np.float64(got[2][:2]).tobytes(), got[2][2], tuple(got[3].values())))
    assert len(figures) == 1


def test_a_scale_the_scale_dtype_cannot_hold_is_refused():
    x = np.full((2, 64), 1e30, np.float32)
    want, got = _both(x, "int8", 1, "float16", None, False)
    assert want[0] is None and got[0] is None


def test_single_rows_and_a_one_element_weight():
    for shape, code, g in [((1, 1), "int4", None), ((1, 8), "int4", 8), ((1, 3), "float8_e4m3fn", None),
                           ((1, 4), "int8", 4)]:
        x = weight(shape, np.dtype(np.float32), special=False)
        assert_same_rows(*_both(x, code, 0, "float32", g, False))


# --- through the command's path: the dispatch hook in gpuq.checkpoints.fused ---------------------

def _cuda_device():
    from gpuq.checkpoints.env import CudaDevice

    return CudaDevice()


@pytest.mark.parametrize("method", ["minmax", "mse"])
@pytest.mark.parametrize("name", ["int4-g128-sym-bf16", "int4-channel-asym-f16", "int8-g64-sym-f32",
                                  "fp8-channel-bf16", "fp8-tensor-f16"])
def test_the_command_path_writes_the_host_bytes(name, method):
    """mse: the search's scales, chosen on the GPU as the multi-pass path does there, then the pass."""
    scheme, device = SCHEMES[name], _cuda_device()
    x = weight((6, 256), BF16, seed=1)
    assert fused.covers(x, scheme, device, method)
    got = serving.quantize_weight(x, scheme, device, "m.weight", nonfinite="allow", method=method)
    assert_same(serving.quantize_weight(x, scheme, HostDevice(), "m.weight", nonfinite="allow", method=method), got)
    if _SIM:
        import cupy

        names = [r.name for r in cupy._sim.launches]
        assert any(n.startswith("gpuq::weight_pass<") for n in names)
        assert any("mse" in n for n in names) == (method == "mse")  # the search ran on the GPU
    tensors, stats, counts = got
    want_counts, signal, error, max_err = numpy_figures(x, tensors, scheme)  # plain NumPy
    assert counts == want_counts and stats["max_abs_error"] == max_err
    assert stats["signal"] == pytest.approx(signal, rel=1e-12, abs=0.0)
    assert stats["error"] == pytest.approx(error, rel=1e-12, abs=0.0)


def test_the_command_path_falls_back_where_a_scale_cannot_be_held(monkeypatch):
    """The pass declines (None), and the command says what the multi-pass path on the GPU says."""
    scheme, device = SCHEMES["int8-channel-sym-f16"], _cuda_device()
    x = np.full((2, 64), 1e30, np.float32)
    assert fused.quantize_weight(x, scheme, "m", device=device) is None
    with pytest.raises(CliError) as fast:
        serving.quantize_weight(x, scheme, device, "m.weight")
    monkeypatch.setattr(fused, "covers", lambda *a: False)
    with pytest.raises(CliError) as slow:
        serving.quantize_weight(x, scheme, device, "m.weight")
    assert str(fast.value) == str(slow.value)


def test_float64_weights_and_searched_block_scales_keep_the_multi_pass_path():
    from gpuq.checkpoints.formats.fp8_blocks import FP8_BLOCK, FP8_BLOCKS
    from gpuq.checkpoints.serving.formats import WeightScheme, fp8_code

    assert not fused.covers(np.zeros((2, 128)), SCHEMES["int4-g128-sym-bf16"], _cuda_device(), "minmax")
    block = WeightScheme(fp8_code(), "block", True, "float32", FP8_BLOCKS, block=FP8_BLOCK)
    for device in (_cuda_device(), HostDevice()):  # min/max block scales: the block kernel; the search's: not
        assert fused.covers(np.zeros((2, 128), np.float32), block, device, "minmax")
        assert not fused.covers(np.zeros((2, 128), np.float32), block, device, "mse")
    assert not fused.covers(np.zeros((2, 128)), block, _cuda_device(), "minmax")


# --- the run loop: two streams, pinned buffers -----------------------------------------------------

def _jobs(log):
    """Five weights of different dtypes, shapes and schemes, each read by ``fill`` (logged)."""
    specs = [(BF16, (17, 384), "int4", 2, "bfloat16", 128, False),
             (np.dtype(np.float16), (3, 1025), "float8_e4m3fn", 1, "float32", None, False),
             (np.dtype(np.float32), (5, 77), "int8", 0, "float32", None, False),
             (BF16, (5, 130), "float8_e4m3fn", 1, "bfloat16", None, True),
             (np.dtype(np.float32), (12, 256), "int4", 1, "float32", 128, False)]
    jobs, hosts = [], {}
    for k, (dt, shape, code, sym, sdt, g, tensor) in enumerate(specs):
        x = weight(shape, dt, seed=10 + k)
        p = cuda_pass.plan(shape, fused_cuda._dtype_name(dt), code_type(code), sym, EPS, sdt, g or shape[1], tensor)

        def fill(buf, x=x, k=k):
            log.append(("fill", k))
            buf[...] = x

        jobs.append(fused_cuda.Job(k, shape, dt, fill, p))
        out = _out(shape, code_type(code))
        hosts[k] = (host_pass.quantize_rows(x, code_type(code), sym, EPS, sdt, g or shape[1], tensor, out), out)
    return jobs, hosts


def test_the_stream_loop_gives_each_weight_the_host_pass():
    log = []
    jobs, hosts = _jobs(log)
    pipe = fused_cuda.Pipeline()
    for key, r in fused_cuda.quantize_stream(jobs, pipe):
        log.append(("result", key))
        assert not r.failed
        got = (r.scales, r.zps, r.figures, r.counts)
        assert_same_rows(hosts[key], (got, r.codes))
    # Each weight's read comes before the wait for the one before it: the read overlaps the GPU.
    assert log == [("fill", 0), ("fill", 1), ("result", 0), ("fill", 2), ("result", 1), ("fill", 3),
                   ("result", 2), ("fill", 4), ("result", 3), ("result", 4)]


@pytest.mark.skipif(not _SIM, reason="the launch records of the CPU execution of the kernels")
def test_the_stream_loop_alternates_two_streams_and_waits_on_events_only():
    import cupy

    jobs, _ = _jobs([])
    cupy._sim.clear_records()
    list(fused_cuda.quantize_stream(jobs, fused_cuda.Pipeline()))
    streams = [r.stream_ptr for r in cupy._sim.launches if r.name.startswith("gpuq::weight_pass<")]
    assert len(streams) == 5 and len(set(streams)) == 2
    assert all(a != b for a, b in zip(streams, streams[1:]))  # weight i and i + 1 on different streams
    assert 0 not in streams  # never the legacy default stream, which would order them
    # The host waits for each weight's event once, and for nothing else (the downloads are async).
    assert [s.what for s in cupy._sim.syncs] == ["Event.synchronize"] * 5


def test_a_slot_is_not_refilled_before_its_result_is_taken():
    p = cuda_pass.plan((2, 128), "float32", code_type("int4"), 1, EPS, "float32", 128, False)
    pipe = fused_cuda.Pipeline()
    pipe.submit(np.zeros((2, 128), np.float32), p)
    pipe.submit(np.zeros((2, 128), np.float32), p)
    with pytest.raises(RuntimeError, match="result not taken"):
        pipe.input((2, 128), np.float32)


@pytest.mark.skipif(not _SIM, reason="the stand-in's model of pinned memory")
def test_the_stand_in_uploads_pinned_memory_when_the_stream_runs():
    """The model the loop is tested on: an upload from pinned memory reads it when its stream runs
    (a buffer refilled too early uploads the new bytes), one from pageable memory at the call."""
    import cupy

    mem = cupy.cuda.alloc_pinned_memory(64)
    pinned = np.frombuffer(mem, np.uint8, 64)
    pageable = np.zeros(64, np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    a, b = cupy.empty(64, cupy.uint8), cupy.empty(64, cupy.uint8)
    pinned[:], pageable[:] = 1, 1
    a.set(pinned, stream=stream)
    b.set(pageable, stream=stream)
    pinned[:], pageable[:] = 2, 2  # before the stream ran
    stream.synchronize()
    assert (a.get() == 2).all() and (b.get() == 1).all()
    assert cupy.cuda._pinned.is_pinned(pinned[8:16]) and not cupy.cuda._pinned.is_pinned(pageable)


def test_the_checkpoint_bench_runs_the_gpu_pass(tmp_path):
    """bench/checkpoint.py's ``--device cuda`` in-memory figure runs (its time on the stand-in is
    no GPU's: this checks the path, not a number)."""
    from bench import checkpoint as ck

    folder = ck.make_folder(str(tmp_path / "model"), 64, 1)
    assert ck.in_memory(folder, "fp8", "cuda") > 0
    assert ck.command(folder, "out", "int4", "cuda")[-3:] == ["--device", "cuda", "-q"]


def test_the_checkpoint_bench_dry_runs_on_cuda(tmp_path, monkeypatch):
    """``bench/checkpoint.py --device cuda`` end to end at a tiny scale: the command (a subprocess
    that gets this session's CuPy through PYTHONPATH) and the in-memory pass run, the figures
    name the CuPy they ran on, and a stand-in run states no target."""
    import json
    import os

    from bench import checkpoint as ck
    from cudasim import install

    if _SIM:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([install.FAKE_DIR, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "figures.json"
    assert ck.main(["--scale", "64", "--layers", "1", "--device", "cuda", "--top", "0", "--no-warmup",
                    "--scheme", "fp8", "--dir", str(tmp_path / "model"), "--tmp", str(tmp_path),
                    "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["device"] == "cuda" and got["cuda"] == ("stand-in" if _SIM else "gpu")
    row = got["schemes"]["fp8"]
    assert row["input_gb_s"] > 0 and row["in_memory_s"] > 0
    assert ("target_met" in row) == (not _SIM)


@pytest.mark.parametrize("flags", [["--dtype", "int4"], ["--dtype", "int8", "--asymmetric"],
                                   ["--dtype", "float8_e4m3fn"]], ids=["int4", "int8-asym", "fp8"])
def test_the_command_on_cuda_writes_the_cpu_bytes(tmp_path, capsys, flags):
    """``gpuq quantize MODEL --format compressed-tensors --device cuda`` through the GPU's pass:
    every output file byte for byte the ``--device cpu`` one's, the report's rows the same but
    for the float64 sums' order (SQNR within 1e-9)."""
    import json
    import sys
    from pathlib import Path

    from gpuq import cli

    sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))
    from _serving import make_model

    make_model(tmp_path / "m", hidden=128, inter=256, seed=3, extra=False)
    reports = {}
    for device in ("cpu", "cuda"):
        argv = ["quantize", str(tmp_path / "m"), "-o", str(tmp_path / device), "--format", "compressed-tensors",
                *flags, "--device", device, "-q", "--json"]
        assert cli.main(argv) == 0
        reports[device] = json.loads(capsys.readouterr().out)
    if _SIM:
        import cupy

        assert any(r.name.startswith("gpuq::weight_pass<") for r in cupy._sim.launches)
    files = sorted(p.name for p in (tmp_path / "cpu").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "cuda").iterdir())
    for name in files:
        assert (tmp_path / "cpu" / name).read_bytes() == (tmp_path / "cuda" / name).read_bytes(), name
    rows = {d: {r["name"]: r for r in rep["tensors"]} for d, rep in reports.items()}
    assert rows["cpu"].keys() == rows["cuda"].keys()
    assert sum(r["quantized"] for r in rows["cpu"].values()) == 7  # the layer's seven Linear weights
    for name, a in rows["cpu"].items():
        b = rows["cuda"][name]
        assert {k: v for k, v in a.items() if k != "sqnr_db"} == {k: v for k, v in b.items() if k != "sqnr_db"}
        assert (a["sqnr_db"] is None) == (b["sqnr_db"] is None)
        if a["sqnr_db"] is not None:
            assert b["sqnr_db"] == pytest.approx(a["sqnr_db"], rel=1e-9)


# --- the command's shard loop: the stream (read into pinned buffers, overlapped with the GPU) -----

def _serving():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))
    import _serving

    return _serving


def _mixed_model(folder, seed=3):
    """Two shards of a two-layer Llama folder whose weights the stream must interleave with
    other paths: NaN, +Inf and -Inf in one weight (the GPU's pass counts them), a float64
    weight (the pass does not take it: the multi-pass path, in its turn), norms and the
    embedding kept in float."""
    sv = _serving()
    t = sv.make_model(folder / "one", hidden=128, inter=256, layers=2, seed=seed, extra=False)
    q = t["model.layers.0.self_attn.q_proj.weight"].copy()
    q[0, 3], q[5, 7], q[9, :2] = np.nan, np.inf, -np.inf
    t["model.layers.0.self_attn.q_proj.weight"] = q
    t["model.layers.1.mlp.down_proj.weight"] = t["model.layers.1.mlp.down_proj.weight"].astype(np.float64)
    from gpuq.checkpoints.files import write_checkpoint

    write_checkpoint(str(folder / "one" / "model.safetensors"), "safetensors", t, None, {"format": "pt"})
    sv.reshard(folder / "one", folder / "m", lambda k: 1 if ".layers.1." in k else 0, 2)
    return folder / "m"


def _run_both(tmp_path, capsys, model, flags):
    """``{device: (rc, report or None, stderr)}`` of the command on the cpu and on cuda."""
    import json

    sv, got = _serving(), {}
    for device in ("cpu", "cuda"):
        rc = sv.gpuq_main("quantize", model, "-o", tmp_path / device, "--format", "compressed-tensors",
                          *flags, "--device", device, "-q", "--json")
        out = capsys.readouterr()
        got[device] = (rc, json.loads(out.out) if rc == 0 else None, out.err)
    return got


@pytest.mark.parametrize("flags", [["--dtype", "int4", "--nonfinite", "warn"],
                                   ["--dtype", "float8_e4m3fn", "--per-tensor", "--nonfinite", "allow"],
                                   ["--dtype", "int8", "--asymmetric", "--calibrate", "mse", "--nonfinite", "allow"],
                                   ["--preset", "MXFP8A16", "--nonfinite", "allow"]],
                         ids=["int4-g128", "fp8-tensor", "int8-asym-mse", "mxfp8"])
def test_the_shard_loop_streams_every_kind_of_tensor_as_the_cpu_writes_it(tmp_path, capsys, flags):
    """Two shards through the stream, the GPU's weights between kept tensors and a float64 weight
    the pass does not take: the same files byte for byte, the same rows (SQNR to 1e-12), the
    same warnings in the same order."""
    from report_rows import assert_same_rows

    model = _mixed_model(tmp_path)
    got = _run_both(tmp_path, capsys, model, flags)
    assert got["cpu"][0] == got["cuda"][0] == 0
    assert got["cpu"][2] == got["cuda"][2]  # the NaN/Inf warning (with warn), in its turn
    assert ("q_proj.weight' has 4 non-finite values" in got["cpu"][2]) == ("warn" in flags)
    files = sorted(p.name for p in (tmp_path / "cpu").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "cuda").iterdir()) and len(files) >= 4
    for name in files:
        assert (tmp_path / "cpu" / name).read_bytes() == (tmp_path / "cuda" / name).read_bytes(), name
    rows = {d: got[d][1]["tensors"] for d in got}
    assert_same_rows(rows["cuda"], rows["cpu"])
    q = next(r for r in rows["cuda"] if r["name"].endswith("0.self_attn.q_proj.weight"))
    assert q["nonfinite"] == {"nan": 1, "posinf": 1, "neginf": 2}
    assert sum(r["quantized"] for r in rows["cuda"]) == 14
    if _SIM:  # the GPU's pass ran (the last shard's weights), with the given scales where there are
        import cupy

        names = [r.name for r in cupy._sim.launches]
        assert any(n.startswith("gpuq::weight_pass<") for n in names)
        assert any("mse" in n for n in names) == ("mse" in flags)


def test_the_shard_loop_reads_the_next_weight_before_it_waits_for_the_gpu(tmp_path, capsys, monkeypatch):
    """Each GPU weight is read straight into pinned memory, and the read of the next one comes
    before the wait for the one before it; the kept tensors and the float64 weight are handled
    in their turn (the rows keep the file's order) while the GPU has the weight after them."""
    from gpuq.checkpoints import files

    model = _mixed_model(tmp_path)
    log = []
    load, mapped, span = files.Checkpoint.load, files.Checkpoint.mapped, files.Checkpoint.file_span
    result = fused_cuda.Pipeline.result
    inside = []  # a read that falls back on another (a map or a kernel copy through load) is logged once

    def logged(read, name, into=False, pinned=None):
        if not inside:
            log.append(("read", name, into, pinned))
        inside.append(name)
        try:
            return read()
        finally:
            inside.pop()

    def logged_load(self, name, out=None):
        # Into one of the stream's pinned input buffers (the host's reads map the file or copy it)
        slots = fused_cuda._pipeline("stream").slots
        into = out is not None and any(s.host.get("in") is not None and np.shares_memory(out, s.host["in"])
                                       for s in slots)
        pinned = None
        if into and _SIM:
            import cupy

            pinned = cupy.cuda._pinned.is_pinned(out)
        return logged(lambda: load(self, name, out), name, into, pinned)

    def logged_result(self, slot):
        log.append(("wait",))
        return result(self, slot)

    monkeypatch.setattr(files.Checkpoint, "load", logged_load)
    monkeypatch.setattr(files.Checkpoint, "mapped", lambda self, name: logged(lambda: mapped(self, name), name))
    # a kept tensor's kernel copy (writer.copy_from) asks for its span in the file
    monkeypatch.setattr(files.Checkpoint, "file_span", lambda self, name: logged(lambda: span(self, name), name))
    monkeypatch.setattr(fused_cuda.Pipeline, "result", logged_result)
    assert _serving().gpuq_main("quantize", model, "-o", tmp_path / "o", "--format", "compressed-tensors",
                                "--dtype", "int8", "--device", "cuda", "-q", "--nonfinite", "allow") == 0
    capsys.readouterr()
    reads = [e for e in log if e[0] == "read" and "/" not in e[1]]
    assert reads, log
    gpu = [e for e in reads if e[2]]
    assert len(gpu) == 13 and all(e[3] in (True, None) for e in gpu)  # 14 Linear weights, one float64
    assert not any(e[2] for e in reads if "down_proj" in e[1] and ".1." in e[1])
    # The log the overlap gives: each tensor is handed back (a GPU weight's wait, a host tensor's
    # read) once the next one is read and queued, so the GPU's work on a weight overlaps the read
    # of the next and the host's work on the tensor before it.
    seq = [("G" if e[2] else "H") if e[0] == "read" else "W" for e in log if e[0] == "wait" or e in reads]
    kind_of = {e[1]: "G" if e[2] else "H" for e in reads}
    with files.Checkpoint(str(model / "model-00001-of-00002.safetensors")) as a, \
            files.Checkpoint(str(model / "model-00002-of-00002.safetensors")) as b:
        order = [[kind_of[n] for n in a.names], [kind_of[n] for n in b.names]]  # each shard is a stream
    want = []
    for kinds in order:
        prev = None
        for kind in kinds:
            want += ["G"] if kind == "G" else []
            if prev is not None:
                want.append("W" if prev == "G" else "H")
            prev = kind
        want.append("W" if prev == "G" else "H")
    assert "".join(seq) == "".join(want) and "GHGW" in "".join(seq) and "GWGW" in "".join(seq)


def test_a_weight_the_gpu_refuses_midway_gives_the_cpu_error_and_frees_the_stream(tmp_path, capsys, monkeypatch):
    """A weight whose scale float16 cannot hold, between two the GPU takes: the pass refuses it,
    and the command says the GPU's multi-pass line on that tensor; a NaN under --nonfinite
    error: the cpu's line; and the
    stream's slots are free for the next run, which writes the cpu's bytes."""
    import json

    sv = _serving()
    t = sv.make_model(tmp_path / "m", hidden=128, inter=256, seed=5, dtype="float32", extra=False)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "dtype": "float16"}))  # float16 scales
    bad = dict(t)
    bad["model.layers.0.self_attn.k_proj.weight"] = np.full((64, 128), 1e30, np.float32)
    from gpuq.checkpoints.files import write_checkpoint

    (tmp_path / "bad").mkdir()
    write_checkpoint(str(tmp_path / "bad" / "model.safetensors"), "safetensors", bad, None, {"format": "pt"})
    for f in ("config.json", "generation_config.json"):
        (tmp_path / "bad" / f).write_bytes((tmp_path / "m" / f).read_bytes())
    got = _run_both(tmp_path, capsys, tmp_path / "bad", ["--dtype", "int8"])
    assert got["cpu"][0] == got["cuda"][0] == 2
    for d in ("cpu", "cuda"):
        assert got[d][2].startswith("gpuq: error: tensor 'model.layers.0.self_attn.k_proj.weight'")
    with monkeypatch.context() as m:  # the GPU's multi-pass path alone says the same line
        m.setattr(fused, "covers", lambda *a: False)
        assert sv.gpuq_main("quantize", tmp_path / "bad", "-o", tmp_path / "slow", "--format", "compressed-tensors",
                            "--dtype", "int8", "--device", "cuda", "-q") == 2
        assert capsys.readouterr().err == got["cuda"][2]
    nan = dict(t)
    nan["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"].copy()
    nan["model.layers.0.mlp.up_proj.weight"][1, 1] = np.nan
    write_checkpoint(str(tmp_path / "bad" / "model.safetensors"), "safetensors", nan, None, {"format": "pt"})
    got = _run_both(tmp_path, capsys, tmp_path / "bad", ["--dtype", "int8", "--nonfinite", "error"])
    assert got["cpu"][0] == got["cuda"][0] == 2
    assert got["cpu"][2] == got["cuda"][2] and "up_proj" in got["cuda"][2]
    assert all(s.pending is None for s in fused_cuda._pipeline("stream").slots)
    for d in ("cpu", "cuda"):
        import shutil

        shutil.rmtree(tmp_path / d, ignore_errors=True)
    got = _run_both(tmp_path, capsys, tmp_path / "m", ["--dtype", "int8"])
    assert got["cpu"][0] == got["cuda"][0] == 0
    for name in sorted(p.name for p in (tmp_path / "cpu").iterdir()):
        assert (tmp_path / "cpu" / name).read_bytes() == (tmp_path / "cuda" / name).read_bytes(), name


# --- given scales (the MSE search's, MX's e8m0 ones): the pass's codes and figures only ----------

def _given(x, code_name, symmetric, g, tensor, seed):
    """Scales (and zps) no min/max gives: the host pass's own scaled by random factors in
    [0.5, 2), zero points drawn in the code range (what a search may choose)."""
    code = code_type(code_name)
    g = g or x.shape[1]
    first = host_pass.quantize_rows(x, code, symmetric, EPS, "float32", g, tensor, _out(x.shape, code))
    rng = np.random.default_rng(seed)
    scales = (first[0] * rng.uniform(0.5, 2.0, first[0].shape)).astype(np.float32)
    zps = None if first[1] is None else rng.integers(code.qmin, code.qmax + 1, first[1].shape).astype(np.int32)
    return scales, zps


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in (0, 1)],
                         ids=lambda c: "kind{}-{}-{}".format(c[0], "warp" if c[1] else "block",
                                                             "tensor" if c[2] else "groups"))
def test_given_scales_give_the_host_pass_codes_and_figures(case):
    code_name, symmetric, sdt, g, tensor, shape = CASES[case]
    x = weight(shape, BF16, seed=21)
    given = _given(x, code_name, symmetric, g, tensor, seed=22)
    code, gg = code_type(code_name), g or shape[1]
    o_host, o_gpu = _out(shape, code), _out(shape, code)
    want = host_pass.quantize_rows(x, code, symmetric, EPS, sdt, gg, tensor, o_host, given=given)
    got = fused_cuda.quantize_rows(x, code, symmetric, EPS, sdt, gg, tensor, o_gpu, given=given)
    assert_same_rows((want, o_host), (got, o_gpu))
    assert got[0].tobytes() == given[0].tobytes()  # read as they are: not rounded, not chosen again
    if _SIM:  # no range reduction: the per-tensor keys are not used
        import cupy

        assert registry.weight_range_name("bfloat16") not in [r.name for r in cupy._sim.launches[-2:]]


# --- fine-grained fp8: one scale a 128 x 128 block (weight_blocks) --------------------------------

BLOCK_CASES = [  # (dtype, fp8 code, scale dtype, shape, block): ragged edges, one block, blocks of a row
    (BF16, "float8_e4m3fn", "float32", (300, 200), (128, 128)),
    (np.dtype(np.float16), "float8_e4m3fn", "bfloat16", (129, 257), (128, 128)),
    (np.dtype(np.float32), "float8_e5m2", "float32", (17, 1025), (128, 128)),
    (np.dtype(np.float32), "float8_e4m3fn", "bfloat16", (5, 77), (2, 16)),
    (BF16, "float8_e5m2", "bfloat16", (1, 1), (128, 128)),
    (np.dtype(np.float16), "float8_e5m2", "float32", (130, 131), (64, 32)),
]


@pytest.mark.parametrize("case", range(len(BLOCK_CASES)))
def test_block_scales_are_the_host_block_pass(case):
    dtype, code_name, sdt, shape, block = BLOCK_CASES[case]
    x = weight(shape, dtype, seed=30 + case, special=shape[0] >= 3)
    code = code_type(code_name)
    o_host, o_gpu = np.full(shape, 0xAB, np.uint8), np.full(shape, 0xCD, np.uint8)
    want = host_pass.quantize_blocks(x, code, 1, EPS, sdt, block, o_host)
    before = x.tobytes()
    got = fused_cuda.quantize_blocks(x, code, 1, EPS, sdt, block, o_gpu)
    assert x.tobytes() == before
    assert want is not None and got is not None
    assert o_host.tobytes() == o_gpu.tobytes()
    assert want[0].shape == got[0].shape and want[0].tobytes() == got[0].tobytes()
    assert want[2] == got[2]
    (ws, we, wm), (gs, ge, gm) = want[1], got[1]
    assert gm == wm or (np.isnan(gm) and np.isnan(wm))
    assert gs == pytest.approx(ws, rel=1e-12, abs=0.0) and ge == pytest.approx(we, rel=1e-12, abs=0.0)
    if _SIM:
        import cupy

        kind = 1 + registry.FP8_FMT[code_name]
        assert registry.weight_blocks_name(fused_cuda._dtype_name(dtype), kind) in [r.name for r in cupy._sim.launches]


def test_block_scales_with_blocks_taken_in_turn_and_refused(monkeypatch):
    """A grid of two thread blocks takes 6 blocks in turn; a scale float16 cannot hold is refused."""
    monkeypatch.setattr(cuda_pass, "MAX_BLOCKS", 2)
    x = weight((300, 200), np.dtype(np.float32), seed=40)
    code = code_type("float8_e4m3fn")
    o_host, o_gpu = np.zeros((300, 200), np.uint8), np.zeros((300, 200), np.uint8)
    want = host_pass.quantize_blocks(x, code, 1, EPS, "float32", (128, 128), o_host)
    got = fused_cuda.quantize_blocks(x, code, 1, EPS, "float32", (128, 128), o_gpu)
    assert o_host.tobytes() == o_gpu.tobytes() and want[0].tobytes() == got[0].tobytes() and want[2] == got[2]
    big = np.full((4, 4), 1e30, np.float32)
    assert host_pass.quantize_blocks(big, code, 1, EPS, "float16", (2, 2), np.zeros((4, 4), np.uint8)) is None
    assert fused_cuda.quantize_blocks(big, code, 1, EPS, "float16", (2, 2), np.zeros((4, 4), np.uint8)) is None


def test_the_fp8_blocks_command_on_cuda_writes_the_cpu_bytes(tmp_path, capsys):
    """``--format fp8-blocks --device cuda``: the block kernel in the shard loop's stream, the
    cpu's bytes and rows."""
    from report_rows import assert_same_rows

    model = _mixed_model(tmp_path)
    sv, got = _serving(), {}
    import json

    for device in ("cpu", "cuda"):
        assert sv.gpuq_main("quantize", model, "-o", tmp_path / device, "--format", "fp8-blocks", "--device", device,
                            "-q", "--json", "--nonfinite", "allow") == 0
        got[device] = json.loads(capsys.readouterr().out)
    for name in sorted(p.name for p in (tmp_path / "cpu").iterdir()):
        assert (tmp_path / "cpu" / name).read_bytes() == (tmp_path / "cuda" / name).read_bytes(), name
    assert_same_rows(got["cuda"]["tensors"], got["cpu"]["tensors"])
    if _SIM:
        import cupy

        assert any(r.name.startswith("gpuq::weight_blocks<") for r in cupy._sim.launches)
