"""Make ``torchao_scales.npz``: torchao 0.18's symmetric scales, the full-range rule's fixtures.

The rule (torchao ``MappingType.SYMMETRIC``, compressed-tensors, GPTQ): ``scale =
max|x| / ((qmax - qmin) / 2)``, clamped below by ``eps``. Run offline, never in the tests
(torchao is no dependency of gpuq or of its tests)::

    pip install --target /tmp/tao --no-deps torchao==0.18.0
    PYTHONPATH=/tmp/tao python tests/data/full_range/make_fixtures.py

It stores, for each case, the float32 input ``x_<case>``, torchao's block size and, for each
code range, the float32 scales of ``choose_qparams_affine(x, MappingType.SYMMETRIC,
block_size, ..., quant_min, quant_max, eps=float32 tiny, scale_dtype=float32)``
(``s_<case>_<code>``). ``eps`` is gpuq's default (the smallest normal float32), not
torchao's (its machine epsilon), so all-zero and subnormal blocks compare too.
NaN is left out: torchao's max propagates it, gpuq's ignores it.
"""

import os

import numpy as np
import torch
import torchao
from torchao.quantization.quant_primitives import MappingType, choose_qparams_affine

HERE = os.path.dirname(os.path.abspath(__file__))
CODES = {"int8": (-128, 127), "int4": (-8, 7), "uint8": (0, 255), "uint4": (0, 15)}
TINY = float(np.finfo(np.float32).tiny)


def cases():
    rng = np.random.default_rng(40)
    g = rng.standard_normal((17, 1024), dtype=np.float32) * np.float32(0.02)
    g[0] = 0                                    # an all-zero row: eps
    g[1, :128] = np.float32(1e-40)              # a subnormal group: amax / 7.5 < eps
    g[2, :128] = np.float32(3e38)               # near float32's max
    g[3, 5] = -np.float32(7.5)                  # a negative max: -8 * s exactly (int4)
    g[4] = rng.integers(-8, 8, 1024).astype(np.float32)  # integers: ties of x / s
    c = rng.standard_normal((5, 1025), dtype=np.float32)
    t = rng.standard_normal((1, 17), dtype=np.float32) * np.float32(1e-3)
    # case -> (x, torchao block size): groups of 128, per channel (rows), per tensor
    return {"g128": (g, (1, 128)), "channel": (c, (1, 1025)), "tensor": (t, (1, 17))}


def main():
    out = {"torchao_version": np.array(torchao.__version__)}
    for case, (x, block) in cases().items():
        out[f"x_{case}"] = x
        out[f"block_{case}"] = np.array(block)
        for code, (qmin, qmax) in CODES.items():
            s, _ = choose_qparams_affine(torch.from_numpy(x), MappingType.SYMMETRIC, block,
                                         torch.int32, quant_min=qmin, quant_max=qmax, eps=TINY,
                                         scale_dtype=torch.float32, zero_point_dtype=torch.int32)
            out[f"s_{case}_{code}"] = s.numpy().astype(np.float32)
    np.savez_compressed(os.path.join(HERE, "torchao_scales.npz"), **out)


if __name__ == "__main__":
    main()
