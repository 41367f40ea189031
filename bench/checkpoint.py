"""The checkpoint command against the machine: wall time, a warm copy, peak RSS, a profile.

Run from the repository root (no GPU needed)::

    python bench/checkpoint.py                    # ~2.95 GB bf16 Llama folder (hidden 4096, 6 layers)
    python bench/checkpoint.py --scale 16         # a small folder for a quick run
    python bench/checkpoint.py --scheme int4      # one scheme only (see SCHEMES: int4, fp8,
                                                  # fp8-blocks, nvfp4, mxfp4, mxfp6, mxfp8, gpuq-int4, gpuq-fp8)
    python bench/checkpoint.py --json out.json    # the figures as JSON too
    python bench/checkpoint.py --device cuda      # on a GPU: the command's --device cuda, the GPU pass

It writes, once (cached in ``--dir``), a bfloat16 Llama-shaped model folder made with
NumPy: ``config.json`` with the fields of transformers' ``LlamaConfig`` and one
``model.safetensors`` written by the safetensors library (embedding, 6 decoder layers of
4 attention and 3 MLP matrices plus two norms, a final norm, ``lm_head``; Gaussian
weights of std 0.02). Then, for int4 groups of 128 and fp8 e4m3 per channel, both in
compressed-tensors, it reports in one run:

* ``wall_s``: ``python -m gpuq quantize DIR -o OUT --format compressed-tensors ...`` as a
  user runs it, interpreter start included (so it keeps working whatever the package
  layout behind the command);
* ``ratio_to_copy``: that time over a warm copy of ``model.safetensors`` (the file is
  copied once to warm the page cache, then timed);
* before every timed copy and every timed run, ``os.sync()`` and a ``--pause`` (untimed;
  ``--no-sync`` skips both) empty the writeback queue and let a VM take back the memory freed
  by the step before (:func:`settle`), so each step starts from the same state whatever ran
  before it; the dirty + writeback memory found before each run and its peak during one are
  reported;
* ``peak_rss_mib``: the peak RSS of the command's process tree (the sum over the process
  and its descendants, polled every 10 ms);
* ``in_memory_s``: the same Linear weights, already in memory as bfloat16, through
  ``gpuq.choose_qparams(..., scale_dtype="bfloat16")`` and ``gpuq.quantize``: the kernels'
  share of the command's work;
* a cProfile table of the command (a second run under ``python -m cProfile``), sorted by
  cumulative time, top ``--top`` rows (rows contain one another).

With ``--device cuda`` the command runs with ``--device cuda`` (its shard loop streams the
weights through the GPU's pass: reads into pinned buffers overlapping the kernels) and
``in_memory_s`` is the GPU's one-pass weight (``gpuq.checkpoints.fused_cuda.quantize_stream``:
pinned uploads, the kernel, the codes and figures back, two streams) over the same in-memory
weights, synchronised at the end; ``input_gb_s`` is the folder's bytes over the command's wall
time, the page cache warm (the warm copy reads the file first), against issue 40's GPU target
of at least 2 GB/s (``target_met``). Without a GPU the tests' stand-in runs it as a dry run
(``PYTHONPATH=tests/cudasim/fake python bench/checkpoint.py --device cuda --scale 64 --layers 1
--top 0``; ``"cuda": "stand-in"`` in the figures): its times are no GPU's.

The load of the machine (``os.getloadavg``) is printed before each scheme: on a shared
machine the figures are only as good as the quiet they were taken in.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.llama_folder import llama_tensors  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20

#: The full-size folder: Llama-2-7B's widths with 6 layers, ~2.95 GB in bfloat16.
FULL = {"hidden": 4096, "intermediate": 11008, "vocab": 32000}

#: scheme -> the command's options and the in-memory equivalent (None: no such run). ``file``:
#: gpuq's own format, which takes the folder's ``model.safetensors`` and writes one file.
SCHEMES = {
    "int4": {"argv": ["--format", "compressed-tensors", "--dtype", "int4", "--group-size", "128"],
             "llmc": "W4A16",  # llm-compressor's preset of the same scheme (--llmcompressor)
             # the command's symmetric int4 default: the full-range rule (max|x| / 7.5)
             "qparams": {"axis": 1, "group_size": 128, "dtype": "int4", "symmetric": True,
                         "scale_rule": "full"}},
    "fp8": {"argv": ["--format", "compressed-tensors", "--dtype", "float8_e4m3fn"],
            "llmc": "FP8_DYNAMIC",  # weights: fp8 e4m3 per channel (the activations are dynamic)
            "qparams": {"axis": 0, "dtype": "float8_e4m3fn"}},
    "fp8-blocks": {"argv": ["--format", "fp8-blocks"],
                   "qparams": {"axis": None, "block_size": (128, 128), "dtype": "float8_e4m3fn"},
                   "scale_dtype": "float32"},
    "nvfp4": {"argv": ["--format", "compressed-tensors", "--preset", "NVFP4A16"], "qparams": None},
    "mxfp4": {"argv": ["--format", "compressed-tensors", "--preset", "MXFP4A16"], "qparams": None},
    "mxfp6": {"argv": ["--format", "compressed-tensors", "--preset", "MXFP6A16"], "qparams": None},
    "mxfp8": {"argv": ["--format", "compressed-tensors", "--preset", "MXFP8A16"], "qparams": None},
    "gpuq-int4": {"argv": ["--dtype", "int4", "--symmetric"], "file": True,
                  "qparams": {"axis": 1, "group_size": 128, "dtype": "int4", "symmetric": True,
                              "scale_rule": "full"}, "scale_dtype": "float32"},
    "gpuq-fp8": {"argv": ["--dtype", "float8_e4m3fn"], "file": True,
                 "qparams": {"axis": 0, "dtype": "float8_e4m3fn"}, "scale_dtype": "float32"},
}


def dims(scale: float) -> dict:
    """Widths of the folder at ``1/scale`` of the full size (multiples of 128 for the groups).

    >>> dims(1)
    {'hidden': 4096, 'intermediate': 11008, 'vocab': 32000}
    >>> dims(32)
    {'hidden': 128, 'intermediate': 384, 'vocab': 1000}
    """
    if not scale > 0:
        raise ValueError(f"--scale: expected a number > 0, got {scale!r}")
    w = {k: max(128, 128 * round(FULL[k] / scale / 128)) for k in ("hidden", "intermediate")}
    w["vocab"] = max(128, round(FULL["vocab"] / scale))
    return w


def layout(d: dict, layers: int) -> dict:
    """Tensor name -> shape of a Llama checkpoint (transformers' names).

    >>> t = layout(dims(1), 6)
    >>> len(t), t["model.layers.0.mlp.down_proj.weight"]
    (57, (4096, 11008))
    """
    return llama_tensors(d["hidden"], d["intermediate"], d["vocab"], layers)


def config(d: dict, layers: int) -> dict:
    """``config.json`` with the fields transformers' ``LlamaConfig`` writes."""
    heads = max(1, d["hidden"] // 128)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": d["hidden"], "intermediate_size": d["intermediate"],
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
        "head_dim": d["hidden"] // heads, "vocab_size": d["vocab"], "hidden_act": "silu",
        "max_position_embeddings": 4096, "initializer_range": 0.02, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1, "use_cache": True,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "dtype": "bfloat16", "transformers_version": "5.24.0",
    }


def make_folder(path: str, scale: float, layers: int, seed: int = 0) -> str:
    """Write the bf16 model folder at ``path`` unless its config already matches; return it."""
    import ml_dtypes
    from safetensors.numpy import save_file

    d = dims(scale)
    cfg = config(d, layers)
    cfg_path = os.path.join(path, "config.json")
    if os.path.exists(cfg_path) and os.path.exists(os.path.join(path, "model.safetensors")):
        with open(cfg_path) as f:
            if json.load(f) == cfg:
                return path
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in layout(d, layers).items():
        if len(shape) == 1:  # norms: ones, as transformers initialises them
            tensors[name] = np.ones(shape, ml_dtypes.bfloat16)
        else:
            w = rng.standard_normal(shape, dtype=np.float32)
            w *= np.float32(0.02)
            tensors[name] = w.astype(ml_dtypes.bfloat16)
            del w
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def _tree_rss(pid: int) -> int:
    """Summed RSS in bytes of ``pid`` and its descendants (0 once gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def dirty_mib() -> float:
    """The page cache's dirty and under-writeback memory (``/proc/meminfo`` Dirty + Writeback),
    MiB; 0 where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}
    except OSError:
        return 0.0
    return (kb.get("Dirty", 0) + kb.get("Writeback", 0)) / 1024


#: Seconds to wait after the flush (``--pause``): see :func:`settle`.
PAUSE_S = 3.0


def settle(sync: bool, pause: float | None = None) -> float:
    """Before a timed step: with ``sync``, flush every dirty page to disk (``os.sync``, untimed),
    so each copy and each run starts with an empty writeback queue and is not throttled for
    the pages a step before it wrote (the kernel slows a writer down while the dirty pages
    are over its limits, whoever wrote them), then wait ``pause`` seconds (:data:`PAUSE_S`).

    The wait is for virtual machines that hand freed memory back to the host (virtio_balloon's
    free page reporting, this project's VMs): the pages of a file just removed (the previous
    copy, the previous output) are reported within seconds, and a step that writes new pages
    then pays a host fault for each one (measured: 1.2 GB of pwrite 0.3 s right after such a
    removal, 1.1-2.7 s a few seconds later). After the wait every step starts from that state,
    whichever ran before it. Returns the dirty MiB found before the flush."""
    before = dirty_mib()
    if sync and hasattr(os, "sync"):
        os.sync()
        time.sleep(PAUSE_S if pause is None else pause)
    return before


def run_measured(argv: list, env: dict | None = None) -> dict:
    """Run ``argv``; its wall time, its CPU time (user + system, its descendants' included: less
    sensitive to a shared machine's load than the wall time), the peak RSS of its process tree,
    the peak of the machine's dirty + writeback memory while it ran (``dirty_peak_mib``: the
    kernel throttles writers above its limits) and its exit status."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
        peak = dirty = 0
        # Polling the tree every 10 ms sees the sum over worker processes. The kernel's
        # ru_maxrss is no use here: a child started by vfork inherits this process's own
        # high-water mark (the in-memory step's gigabytes) until its exec.
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _tree_rss(proc.pid))
            dirty = max(dirty, dirty_mib())
            time.sleep(0.01)
        wall = time.perf_counter() - t0
        cpu = usage.ru_utime + usage.ru_stime
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": peak / MIB, "dirty_peak_mib": dirty,
                "rc": proc.returncode,
                "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace")}


def warm_copy(src: str, tmp: str, warm_first: bool = True, sync: bool = True) -> float:
    """Seconds of a copy of ``src`` with the page cache warm (a first, untimed copy warms it
    unless ``warm_first`` is False), after :func:`settle`."""
    dst = os.path.join(tmp, "copy.safetensors")
    if warm_first:
        shutil.copyfile(src, dst)
        os.remove(dst)
    settle(sync)
    t0 = time.perf_counter()
    shutil.copyfile(src, dst)
    t = time.perf_counter() - t0
    os.remove(dst)
    return t


def timed_runs(argv: list, src: str, out: str, tmp: str, reps: int, copy_s: float, sync: bool = True) -> tuple:
    """``reps`` runs of ``argv``, each after a warm copy of ``src`` (so the two see the same
    load on a shared machine; the first run's is ``copy_s``, timed already), each copy and
    run after :func:`settle`: ``(the median run's figures with "runs" (every wall time) and
    "dirty_before_mib" (what each run's flush found), the copies' seconds)``; the CPU time is
    the runs' median, the peak RSS and the dirty peak the largest."""
    runs, copies, dirty = [], [], []
    for i in range(reps):
        copies.append(warm_copy(src, tmp, warm_first=False, sync=sync) if i else copy_s)  # the file is warm
        dirty.append(settle(sync))
        m = run_measured(argv)
        if m["rc"] != 0:
            raise RuntimeError(f"the command failed ({m['rc']}): {m['stderr'][-2000:]}")
        remove_output(out)
        runs.append(m)
    median = sorted(runs, key=lambda r: r["wall_s"])[(reps - 1) // 2]
    return {**median, "cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs), "runs": [r["wall_s"] for r in runs],
            "dirty_peak_mib": max(r["dirty_peak_mib"] for r in runs), "dirty_before_mib": dirty}, copies


def command(folder: str, out: str, scheme: str, device: str = "cpu") -> list:
    """The command line a user types for ``scheme`` (``python -m gpuq quantize ...``): the
    folder into the folder ``out``, or for gpuq's own format its file into ``out.safetensors``."""
    src, dst = folder, out
    if SCHEMES[scheme].get("file"):
        src, dst = os.path.join(folder, "model.safetensors"), out + ".safetensors"
    return [sys.executable, "-m", "gpuq", "quantize", src, "-o", dst, *SCHEMES[scheme]["argv"],
            "--device", device, "-q"]


#: llm-compressor's data-free path as its own script, run by the side environment's interpreter
#: (``--llmcompressor PYTHON``): IN OUT PRESET. Embeddings and lm_head stay in float, as gpuq's
#: serving formats keep them; it prints the call's own time (imports excluded) on stderr.
LLMC_SCRIPT = """
import sys, time
from llmcompressor import model_free_ptq
t0 = time.perf_counter()
model_free_ptq(sys.argv[1], sys.argv[2], scheme=sys.argv[3], ignore=["lm_head", "re:.*embed_tokens"], device="cpu")
print(f"model_free_ptq_s {time.perf_counter() - t0:.3f}", file=sys.stderr)
"""


def llmc_command(python: str, folder: str, out: str, scheme: str) -> list:
    """llm-compressor's ``model_free_ptq`` on ``folder`` into ``out`` with ``scheme``'s preset,
    run by ``python`` (an environment of its own: llm-compressor is no dependency of gpuq)."""
    return [python, "-c", LLMC_SCRIPT, folder, out, SCHEMES[scheme]["llmc"]]


def compare_llmc(python: str, folder: str, out: str, scheme: str, runs: int) -> dict:
    """gpuq's command and llm-compressor's, alternated ``runs`` times each (so both see the same
    load): their wall times, CPU times, peak RSS, and the time inside ``model_free_ptq``."""
    rows = {"gpuq": [], "llmcompressor": []}
    for _ in range(runs):
        for who, argv in (("gpuq", command(folder, out, scheme)), ("llmcompressor", llmc_command(python, folder, out,
                                                                                                scheme))):
            m = run_measured(argv)
            remove_output(out)
            if m["rc"] != 0:
                raise RuntimeError(f"{who} {scheme} failed ({m['rc']}): {m['stderr'][-2000:]}")
            inside = [float(line.split()[1]) for line in m["stderr"].splitlines() if line.startswith("model_free_ptq_s ")]
            rows[who].append({"wall_s": m["wall_s"], "cpu_s": m["cpu_s"], "peak_rss_mib": m["peak_rss_mib"],
                              "call_s": inside[0] if inside else None, "load": os.getloadavg()[0]})
    return rows


def remove_output(out: str) -> None:
    """Remove what :func:`command` wrote at ``out`` (a folder, or ``out.safetensors``)."""
    shutil.rmtree(out, ignore_errors=True)
    if os.path.exists(out + ".safetensors"):
        os.remove(out + ".safetensors")


def _linear_weights(folder: str) -> dict:
    from safetensors.numpy import load_file

    return {k: v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()
            if k.endswith("_proj.weight")}


def in_memory_cuda(folder: str, scheme: str) -> float:
    """Seconds of the GPU's one-pass weight over the folder's Linear weights, in memory: each
    weight copied into a pinned buffer, uploaded, quantized, its codes and figures brought back
    (``fused_cuda.quantize_stream``, the command's scheme: bfloat16 scales, the full-range int4
    rule), after one untimed weight (the kernels' compilation)."""
    from gpuq._codetypes import code_type
    from gpuq._qoptions import FULL_RANGE, SCALE_DTYPES
    from gpuq.backends.cuda import weight_pass
    from gpuq.checkpoints import fused_cuda

    kw = SCHEMES[scheme]["qparams"]
    code = code_type(kw["dtype"])
    symmetric = FULL_RANGE if kw.get("scale_rule") == "full" else 1
    g = kw.get("group_size")

    def job(k, w):
        p = weight_pass.plan(w.shape, "bfloat16", code, symmetric, SCALE_DTYPES["bfloat16"], "bfloat16",
                             g or w.shape[1], False)
        return fused_cuda.Job(k, w.shape, w.dtype, lambda buf: np.copyto(buf, w), p)

    # A small --scale can leave rows that groups of 128 do not divide: the command takes the
    # multi-pass path for those, and they are left out here.
    weights = {k: w for k, w in _linear_weights(folder).items() if not g or w.shape[1] % g == 0}
    pipe = fused_cuda.Pipeline()
    w0 = next(iter(weights.values()))
    list(fused_cuda.quantize_stream([job("warm", w0)], pipe))
    t0 = time.perf_counter()
    for _ in fused_cuda.quantize_stream((job(k, w) for k, w in weights.items()), pipe):
        pass
    return time.perf_counter() - t0


def in_memory(folder: str, scheme: str, device: str = "cpu") -> float:
    """Seconds of choose_qparams + quantize over the folder's Linear weights, loaded in memory
    (``device`` "cuda": :func:`in_memory_cuda`); None for a scheme with no such call (the NVFP4
    and MXFP4 presets)."""
    kw = SCHEMES[scheme]["qparams"]
    if kw is None:  # no one call of the array API does what the format does (NVFP4, MXFP4 presets)
        return None
    import gpuq

    if device == "cuda":
        return in_memory_cuda(folder, scheme)
    weights = _linear_weights(folder)
    sdt = SCHEMES[scheme].get("scale_dtype", "bfloat16")
    # One small call first: the numba compilation is not the weights' time.
    w0 = next(iter(weights.values()))[:2, :128]
    s, z = gpuq.choose_qparams(w0, scale_dtype=sdt, **kw)
    t0 = time.perf_counter()
    for w in weights.values():
        s, z = gpuq.choose_qparams(w, scale_dtype=sdt, **kw)
        gpuq.quantize(w, s, z, axis=kw["axis"], group_size=kw.get("group_size"),
                      block_size=kw.get("block_size"), dtype=kw["dtype"])
    return time.perf_counter() - t0


def profile(folder: str, out: str, scheme: str, tmp: str, top: int, device: str = "cpu",
            sync: bool = True) -> str:
    """The command under cProfile (after :func:`settle`): its ``top`` rows by cumulative time,
    as pstats prints them."""
    prof = os.path.join(tmp, f"{scheme}.prof")
    argv = command(folder, out, scheme, device)
    argv[1:1] = ["-m", "cProfile", "-o", prof]
    settle(sync)
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"profiled run failed ({res.returncode}): {res.stderr[-2000:]}")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    text = buf.getvalue()
    # Keep the table from its header on: the lines above it are pstats' preamble.
    i = text.find("ncalls")
    return text[i:].rstrip() if i >= 0 else text.rstrip()


#: The issue's figure for ``--device cuda``: GB/s of input from the page cache (issue 40).
TARGET_GB_S = 2.0


def cuda_kind() -> str:
    """``"gpu"`` where the CuPy this process (and the command it starts, whose environment it
    shares) imports is the real one, ``"stand-in"`` for the tests' CPU execution of the kernels
    (``PYTHONPATH=tests/cudasim/fake``: a dry run, whose times are no GPU's)."""
    import cupy

    return "stand-in" if hasattr(cupy, "_sim") else "gpu"


def run(args) -> dict:
    folder = make_folder(args.dir or os.path.join(tempfile.gettempdir(),
                                                  f"gpuq-bench-llama-s{args.scale:g}-l{args.layers}"),
                         args.scale, args.layers)
    src = os.path.join(folder, "model.safetensors")
    size = os.path.getsize(src)
    result = {"folder": folder, "bytes": size, "dims": dims(args.scale), "layers": args.layers,
              "cpus": os.cpu_count(), "device": args.device, "schemes": {}}
    print(f"folder: {folder} ({size / 1e9:.3f} GB, {dims(args.scale)}, {args.layers} layers)")
    if args.device == "cuda":
        result["cuda"] = cuda_kind()
        if result["cuda"] != "gpu":
            print("CuPy is the tests' stand-in (the CPU execution of the kernels): a dry run, no GPU figure")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        copy_s = warm_copy(src, tmp, sync=args.sync)
        result["warm_copy_s"] = copy_s
        print(f"warm copy: {copy_s:.3f} s ({size / copy_s / 1e9:.2f} GB/s)")
        for scheme in args.scheme:
            load = os.getloadavg()
            out = os.path.join(tmp, f"out-{scheme}")
            if args.warmup:
                # A first run fills numba's on-disk cache: a user's later runs do not compile.
                warm = make_folder(os.path.join(tmp, "warmup"), 32, 1)
                subprocess.run(command(warm, out, scheme, args.device), check=True, capture_output=True)
                remove_output(out)
            m, copies = timed_runs(command(folder, out, scheme, args.device), src, out, tmp, args.reps, copy_s,
                                   args.sync)
            mem_s = in_memory(folder, scheme, args.device)
            table = profile(folder, out, scheme, tmp, args.top, args.device, args.sync) if args.top > 0 else ""
            remove_output(out)
            copy_med = statistics.median(copies)
            row = {"wall_s": m["wall_s"], "cpu_s": m["cpu_s"], "ratio_to_copy": m["wall_s"] / copy_med,
                   "runs": m["runs"], "copies_s": copies,
                   "input_gb_s": size / m["wall_s"] / 1e9,
                   "peak_rss_mib": m["peak_rss_mib"], "in_memory_s": mem_s, "synced": args.sync,
                   "dirty_peak_mib": m["dirty_peak_mib"], "dirty_before_mib": m["dirty_before_mib"],
                   "load_before": list(load), "profile": table}
            result["schemes"][scheme] = row
            print(f"\n== {scheme} ({' '.join(SCHEMES[scheme]['argv'])}), load {load[0]:.2f} {load[1]:.2f} "
                  f"{load[2]:.2f}")
            mem = "n/a" if mem_s is None else f"{mem_s:.2f} s"
            if args.reps > 1:
                print(f"{args.reps} runs alternated with a warm copy: command "
                      f"{', '.join(f'{r:.2f}' for r in m['runs'])} s, copy {', '.join(f'{c:.2f}' for c in copies)} s; "
                      f"medians below")
            print(f"command wall: {m['wall_s']:.2f} s (CPU {m['cpu_s']:.2f} s) = {row['ratio_to_copy']:.1f}x the warm "
                  f"copy ({copy_med:.2f} s); "
                  f"{row['input_gb_s']:.2f} GB/s of input; peak RSS {m['peak_rss_mib']:.0f} MiB; "
                  f"{'the GPU pass' if args.device == 'cuda' else 'gpuq.quantize'} in memory {mem}; "
                  f"dirty + writeback {'flushed' if args.sync else 'not flushed'} before each step "
                  f"(found {max(m['dirty_before_mib']):.0f} MiB), peak {m['dirty_peak_mib']:.0f} MiB during a run")
            if result.get("cuda") == "gpu":
                row["target_met"] = row["input_gb_s"] >= TARGET_GB_S
                print(f"input {row['input_gb_s']:.2f} GB/s against the target of {TARGET_GB_S:g} GB/s: "
                      f"{'met' if row['target_met'] else 'not met'}")
            if table:
                print(f"profile (cumulative, top {args.top}):\n{table}")
            if args.llmcompressor and SCHEMES[scheme].get("llmc") and args.device == "cpu":
                row["llmcompressor"] = cmp = compare_llmc(args.llmcompressor, folder, out, scheme, args.llmc_runs)
                for who, runs in cmp.items():
                    print(f"{who:>13}: " + "; ".join(
                        f"wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s, RSS {r['peak_rss_mib']:.0f} MiB"
                        + (f", in the call {r['call_s']:.2f} s" if r["call_s"] is not None else "") for r in runs))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=1.0,
                   help="widths divided by this (1: the ~3 GB folder; 16 or 32 for a quick run)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--scheme", action="append", choices=sorted(SCHEMES),
                   help="repeatable; default: int4 and fp8")
    p.add_argument("--top", type=int, default=25, help="profile rows (0: no profile run)")
    p.add_argument("--reps", type=int, default=1,
                   help="runs of the command, each after a warm copy; the figures are the medians")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the untimed first run of each scheme on a tiny folder")
    p.add_argument("--dir", help="the model folder (made there if missing or different)")
    p.add_argument("--tmp", help="where the outputs and the copy go (default: the system's)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="the command's --device (cuda: on a GPU, the one-pass weight kernel)")
    p.add_argument("--json", help="write the figures to this file too")
    p.add_argument("--no-sync", dest="sync", action="store_false",
                   help="do not flush dirty pages (os.sync, untimed) before each timed copy and run: "
                        "each step then pays for the writeback of the steps before it")
    p.add_argument("--llmcompressor", metavar="PYTHON",
                   help="an interpreter with llm-compressor installed (a side environment): time its "
                        "model_free_ptq beside the command, alternated (int4: W4A16, fp8: FP8_DYNAMIC)")
    p.add_argument("--llmc-runs", type=int, default=2, help="runs of each tool in that comparison")
    p.add_argument("--pause", type=float, default=PAUSE_S,
                   help="seconds to wait after each flush (see settle: VMs that report freed memory)")
    args = p.parse_args(argv)
    globals()["PAUSE_S"] = args.pause
    args.scheme = args.scheme or ["int4", "fp8"]
    result = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
