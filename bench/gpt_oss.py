"""gpt-oss MXFP4 (issue 39): gpuq's decode against transformers' ``convert_moe_packed_tensors``,
``gpuq dequantize`` of a one-layer gpt-oss-20b-shaped folder, and the SQNR of the MX scale rules.

Run from the repository root::

    python bench/gpt_oss.py tensor               # [32, 5760, 90, 16]: gpt-oss-20b's gate_up_proj
    python bench/gpt_oss.py tensor --experts 8   # a quarter of it (less memory for transformers)
    python bench/gpt_oss.py folder               # one layer of gpt-oss-20b (vocabulary included), dequantized
    python bench/gpt_oss.py rules                # SQNR of floor / even / ceil / rceil

``tensor``: each contender runs in its own process (``--child``), with the random blocks and
scales (scale bytes 110..140, as a trained model's) in memory before it starts; it reports the
best of its runs' seconds and the peak RSS growth over the RSS it had with its input in memory
(a thread reading /proc/self/statm every 2 ms), and a hash of its output, which must agree.
Both run on ``--threads`` threads (torch.set_num_threads, gpuq.set_num_threads).
``folder``: ``python -m gpuq dequantize`` in a subprocess, wall time and the peak RSS of its
process tree (bench/checkpoint.py's poll). ``rules``: MXFP4 (e2m1, groups of 32 along the
rows) of the 2-D ``*_proj`` weights of ``gpuq example`` and of Gaussian weights, SQNR =
10 log10(sum x^2 / sum (x - x_hat)^2) in float64 over each set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

MIB = 1 << 20
GATE_UP = (5760, 90)  # gpt-oss-20b: 2 * intermediate 2880 rows, hidden 2880 / 32 groups


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Peak(threading.Thread):
    """The highest RSS seen while running (polled every 2 ms)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.stop = _rss(), threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)


def _inputs(experts: int):
    rng = np.random.default_rng(0)
    rows, groups = GATE_UP
    return (rng.integers(0, 256, (experts, rows, groups, 16), dtype=np.uint8),
            rng.integers(110, 141, (experts, rows, groups), dtype=np.uint8))


def child(who: str, experts: int, reps: int, threads: int) -> dict:
    """One contender's runs on its own input, in this process."""
    blocks, scales = _inputs(experts)
    if who == "gpuq":
        import gpuq
        from gpuq.checkpoints.formats.gpt_oss_experts import dequantize_experts

        gpuq.set_num_threads(threads)
        dequantize_experts(blocks[:1, :64], scales[:1, :64])  # compile outside the timing

        def convert():
            return dequantize_experts(blocks, scales).view(np.uint16)
    else:
        import torch
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        torch.set_num_threads(threads)
        tb, ts = torch.from_numpy(blocks), torch.from_numpy(scales)

        def convert():
            return convert_moe_packed_tensors(tb, ts).view(torch.int16).numpy()
    times, growth = [], 0
    for _ in range(reps):
        base = _rss()
        poll = _Peak()
        poll.start()
        t0 = time.perf_counter()
        out = convert()
        times.append(time.perf_counter() - t0)
        poll.stop.set()
        poll.join()
        growth = max(growth, poll.peak - base)
        digest = hashlib.sha1(memoryview(np.ascontiguousarray(out)).cast("B")).hexdigest()
        out_mib = out.nbytes / MIB
        del out
    return {"who": who, "shape": list(blocks.shape), "best_s": min(times), "times_s": times,
            "rss_growth_mib": growth / MIB, "output_mib": out_mib, "sha1": digest, "threads": threads}


def tensor(args) -> dict:
    res = {}
    for who, reps in (("gpuq", args.reps), ("transformers", 1)):
        run = subprocess.run([sys.executable, __file__, "--child", who, "--experts", str(args.experts),
                              "--reps", str(reps), "--threads", str(args.threads)], capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"{who} failed: {run.stderr[-2000:]}")
        res[who] = json.loads(run.stdout.strip().splitlines()[-1])
        r = res[who]
        print(f"{who:12s} {r['shape']}: best {r['best_s']:.3f} s of {[round(t, 3) for t in r['times_s']]}, "
              f"RSS +{r['rss_growth_mib']:.0f} MiB (output {r['output_mib']:.0f} MiB)", flush=True)
    g, t = res["gpuq"], res["transformers"]
    assert g["sha1"] == t["sha1"], "the outputs differ"
    res["speed_ratio"] = t["best_s"] / g["best_s"]
    print(f"same bits; gpuq {res['speed_ratio']:.1f}x transformers' speed; gpuq RSS growth "
          f"{g['rss_growth_mib'] - g['output_mib']:+.0f} MiB over its output")
    return res


def make_folder(path: str) -> str:
    """One layer of gpt-oss-20b in its published MXFP4 layout, random (scale bytes 110..140)."""
    from gpuq.checkpoints.files import checkpoint_writer

    from ml_dtypes import bfloat16

    h, inter, e, vocab, heads, kv, hd = 2880, 2880, 32, 201088, 64, 8, 64
    p = "model.layers.0."
    dense = {"model.embed_tokens.weight": (vocab, h), "lm_head.weight": (vocab, h), "model.norm.weight": (h,),
             p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
             p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.q_proj.bias": (heads * hd,),
             p + "self_attn.k_proj.weight": (kv * hd, h), p + "self_attn.k_proj.bias": (kv * hd,),
             p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.v_proj.bias": (kv * hd,),
             p + "self_attn.o_proj.weight": (h, heads * hd), p + "self_attn.o_proj.bias": (h,),
             p + "self_attn.sinks": (heads,), p + "mlp.router.weight": (e, h), p + "mlp.router.bias": (e,),
             p + "mlp.experts.gate_up_proj_bias": (e, 2 * inter), p + "mlp.experts.down_proj_bias": (e, h)}
    packed = {p + "mlp.experts.gate_up_proj": (e, 2 * inter, h // 32), p + "mlp.experts.down_proj": (e, h, inter // 32)}
    entries = {n: (s, np.dtype(bfloat16)) for n, s in dense.items()}
    for n, s in packed.items():
        entries[n + "_blocks"] = (s + (16,), np.dtype(np.uint8))
        entries[n + "_scales"] = (s, np.dtype(np.uint8))
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    with checkpoint_writer(os.path.join(path, "model.safetensors"), "safetensors", entries, None,
                           {"format": "pt"}) as w:
        for n, (shape, dt) in entries.items():
            if dt == np.uint8:
                for i in range(shape[0]):  # an expert at a time: the writer's memory stays small
                    lo, hi = (0, 256) if n.endswith("_blocks") else (110, 141)
                    w.write_rows(n, rng.integers(lo, hi, (1,) + shape[1:], dtype=np.uint8), i)
            else:
                rows = shape[0] if len(shape) > 1 else 1
                for r0 in range(0, shape[0], max(1, (1 << 24) // max(1, int(np.prod(shape[1:]))))):
                    part = shape[0] - r0 if len(shape) == 1 else min(rows - r0, (1 << 24) // shape[1])
                    w.write_rows(n, (rng.standard_normal((part,) + shape[1:], dtype=np.float32) * 0.02)
                                 .astype(bfloat16), r0)
    config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": h,
              "intermediate_size": inter, "num_local_experts": e, "num_hidden_layers": 1,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "vocab_size": vocab,
              "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                  "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return path


def folder(args) -> dict:
    from bench.checkpoint import run_measured

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        src = make_folder(os.path.join(tmp, "in"))
        size = os.path.getsize(os.path.join(src, "model.safetensors"))
        m = run_measured([sys.executable, "-m", "gpuq", "dequantize", src, "-o", os.path.join(tmp, "out"), "-q",
                          "--device", "cpu"])
        if m["rc"]:
            raise SystemExit(m["stderr"][-2000:])
        out = os.path.getsize(os.path.join(tmp, "out", "model.safetensors"))
    res = {"in_mib": size / MIB, "out_mib": out / MIB, "wall_s": m["wall_s"], "peak_rss_mib": m["peak_rss_mib"]}
    print(f"gpuq dequantize, one gpt-oss-20b layer ({size / MIB:.0f} MiB -> {out / MIB:.0f} MiB): "
          f"{m['wall_s']:.1f} s, peak RSS {m['peak_rss_mib']:.0f} MiB")
    return res


def rules(args) -> dict:
    import gpuq
    from gpuq.checkpoints.example_data import example_tensors

    rng = np.random.default_rng(0)
    sets = {"gaussian": {"w": rng.standard_normal((2048, 4096), dtype=np.float32) * np.float32(0.02)},
            "gpuq example": {k: v for k, v in example_tensors().items() if k.endswith("_proj.weight")}}
    res = {}
    print("| weights | floor | even (default) | ceil | rceil |\n|---|---|---|---|---|")
    for name, weights in sets.items():
        row = {}
        for rule in ("floor", "even", "ceil", "rceil"):
            signal = noise = 0.0
            for w in weights.values():
                kw = dict(axis=1, group_size=32, dtype="float4_e2m1fn")
                s, _ = gpuq.choose_qparams(w, scale_dtype="float8_e8m0fnu", scale_rule=rule, **kw)
                r = gpuq.dequantize(gpuq.quantize(w, s, **kw), s, axis=1, group_size=32)
                signal += float(np.sum(np.square(w, dtype=np.float64)))
                noise += float(np.sum(np.square(w.astype(np.float64) - r)))
            row[rule] = 10 * np.log10(signal / noise)
        res[name] = row
        print(f"| {name} | " + " | ".join(f"{row[r]:.2f} dB" for r in ("floor", "even", "ceil", "rceil")) + " |")
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", nargs="?", choices=("tensor", "folder", "rules"), default="tensor")
    p.add_argument("--experts", type=int, default=32, help="experts of the [E, 5760, 90, 16] tensor (default 32)")
    p.add_argument("--reps", type=int, default=3, help="gpuq's runs (transformers runs once)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tmp", help="where the folder benchmark writes (about 6 GB)")
    p.add_argument("--child", choices=("gpuq", "transformers"), help=argparse.SUPPRESS)
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.experts, args.reps, args.threads)))
        return 0
    res = {"tensor": tensor, "folder": folder, "rules": rules}[args.what](args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
