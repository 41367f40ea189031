"""SQNR of the two symmetric integer scale rules: gpuq's (``max|x| / 127``, ``/ 7``) and the
full-range rule of torchao, compressed-tensors and GPTQ (``max|x| / 127.5``, ``/ 7.5``).

Run from the repository root::

    python bench/scale_rules.py            # Gaussian weights and the `gpuq example` weights
    python bench/scale_rules.py --json out.json

For int8 and int4, in groups of 128 along the rows, on (a) Gaussian weights (std 0.02,
``--rows`` x 4096, float32) and (b) the 2-D ``*_proj`` weights of ``gpuq example``
(per-row gains and outlier columns): the scales of each rule (gpuq's from
``gpuq.choose_qparams(symmetric=True)``; the full-range rule's from NumPy until
``choose_qparams`` has it), then gpuq's own codes (``gpuq.quantize``: exact division,
saturated to [qmin, qmax]) and ``gpuq.dequantize``. SQNR = 10 log10(sum x^2 / sum (x -
x_hat)^2) in float64 over all the tensors of a set. ``choose_qparams(method="mse")`` is
shown beside them.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import gpuq

HALF = {"int8": np.float32(127.5), "int4": np.float32(7.5)}


def _example_weights() -> dict:
    try:  # the checkpoint code's home after the library refactor, then before it
        from gpuq.checkpoints.example import example_tensors
    except ImportError:
        from gpuq.cli.example import example_tensors
    return {k: v for k, v in example_tensors().items() if k.endswith("_proj.weight")}


def scales(w, dtype, rule):
    """The scales of ``rule`` (``"gpuq"``, ``"full"`` or ``"mse"``) for groups of 128 of ``w``'s rows."""
    if rule == "full":
        pad = -w.shape[1] % 128  # a ragged last group: zeros leave its max as it is
        g = np.pad(w, ((0, 0), (0, pad))).reshape(w.shape[0], -1, 128)
        return np.maximum(np.abs(g).max(-1) / HALF[dtype], np.finfo(np.float32).tiny).astype(np.float32)
    s, _ = gpuq.choose_qparams(w, axis=1, group_size=128, dtype=dtype, symmetric=True,
                               method="mse" if rule == "mse" else "minmax")
    return s


def sqnr(weights: dict, dtype: str, rule: str) -> float:
    signal = noise = 0.0
    for w in weights.values():
        s = scales(w, dtype, rule)
        q = gpuq.quantize(w, s, axis=1, group_size=128, dtype=dtype)
        r = gpuq.dequantize(q, s, axis=1, group_size=128)
        signal += float(np.sum(np.square(w, dtype=np.float64)))
        noise += float(np.sum(np.square(w.astype(np.float64) - r)))
    return 10 * np.log10(signal / noise)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--json")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    sets = {"gaussian": {"w": rng.standard_normal((args.rows, 4096), dtype=np.float32) * np.float32(0.02)},
            "gpuq example": _example_weights()}
    res = {}
    print("| weights | code | gpuq (/127, /7) | full range (/127.5, /7.5) | mse |\n|---|---|---|---|---|")
    for name, weights in sets.items():
        for dtype in ("int8", "int4"):
            row = {rule: sqnr(weights, dtype, rule) for rule in ("gpuq", "full", "mse")}
            res[f"{name} {dtype}"] = row
            print(f"| {name} | {dtype} g128 | {row['gpuq']:.2f} dB | {row['full']:.2f} dB | {row['mse']:.2f} dB |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
