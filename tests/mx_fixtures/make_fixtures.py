"""Make ``torchao_to_mx.npz``: torchao 0.18's ``to_mx`` scales and codes, the oracle of gpuq's
MX ``floor``/``ceil``/``rceil`` rules (issue 37). Run offline; the file is committed, and
tests/test_mx_torchao.py compares gpuq with it (torchao is not a project dependency).

    python -m pip install --no-deps --target /tmp/torchao torchao==0.18.0   # on torch 2.13 CPU
    PYTHONPATH=/tmp/torchao python tests/mx_fixtures/make_fixtures.py

The input per float dtype (float32, bfloat16; stored as float32, exact for both): blocks of 32
of standard normal data at several magnitudes, and blocks built on each rule's thresholds
(amax a power of two, just above and below one, 6 * 2**j, 448 * 2**j), an all-zero block and
tiny blocks whose k would go below -127. Keys: ``x_<wdtype>`` (float32 values) and, per element
type and rule, ``e8m0_<wdtype>_<code>_<rule>`` (uint8 scale bytes, one per block) and
``codes_<wdtype>_<code>_<rule>`` (uint8 codes, one per element, fp4 unpacked).
"""

from pathlib import Path

import numpy as np
import torch
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_mx

CODES = {"float4_e2m1fn": torch.float4_e2m1fn_x2, "float6_e2m3fn": "fp6_e2m3", "float6_e3m2fn": "fp6_e3m2",
         "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
RULES = {"floor": ScaleCalculationMode.FLOOR, "ceil": ScaleCalculationMode.CEIL,
         "rceil": ScaleCalculationMode.RCEIL}


def data():
    """float32 ``(rows, 32)`` input, each row one block."""
    rng = np.random.default_rng(37)
    rows = [rng.standard_normal(32) * m for m in (1e-3, 0.1, 1, 3, 100, 5e4)]
    for j in (-20, -3, 0, 1, 7):
        for a in (1.0, np.nextafter(np.float32(1), 2), np.nextafter(np.float32(2), 0), 1.5, 1.75,
                  6 / 4, 448 / 256, 7.5 / 4, 28 / 16):
            r = rng.uniform(-1, 1, 32) * a * 2.0**j
            r[5] = a * 2.0**j  # the block's amax, exactly
            rows.append(r)
    rows.append(np.zeros(32))
    rows.append(rng.uniform(-1, 1, 32) * 2.0**-140)
    rows.append(rng.uniform(-1, 1, 32) * 2.0**-126)
    x = np.stack(rows).astype(np.float32)
    x[x == 0] = 0.0  # no -0.0: torchao and gpuq differ there as compressed-tensors does
    return x


def main():
    out = {}
    x32 = data()
    for wname, wdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        t = torch.from_numpy(x32).to(wdt)
        out[f"x_{wname}"] = t.float().numpy()
        for code, elem in CODES.items():
            for rule, mode in RULES.items():
                scale, q = to_mx(t, elem, 32, scaling_mode=mode)
                out[f"e8m0_{wname}_{code}_{rule}"] = scale.view(torch.uint8).numpy().reshape(-1)
                qb = q.view(torch.uint8).numpy()
                if code == "float4_e2m1fn":  # element 2i in the low nibble
                    qb = np.stack([qb & 0xF, qb >> 4], axis=-1).reshape(x32.shape)
                out[f"codes_{wname}_{code}_{rule}"] = qb.reshape(x32.shape)
    np.savez_compressed(Path(__file__).with_name("torchao_to_mx.npz"), **out)


if __name__ == "__main__":
    main()
