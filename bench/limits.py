"""Memory limits measured in the same run: a large copy, bytes read + written.

Host: ``np.copyto`` of a 256 MiB buffer into a pre-faulted one, on one thread
and split among ``threads`` threads; the reference for "% of copy" is the
better of the two (the ceiling at the run's thread count).
Device: a device-to-device copy of a 1 GiB buffer, timed with CUDA events.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .timing import CupyEvents, time_cpu, time_gpu

HOST_COPY_BYTES = 256 << 20
DEVICE_COPY_BYTES = 1 << 30


def host_copy(threads: int, nbytes: int = HOST_COPY_BYTES, reps: int = 7) -> dict:
    """Host copy bandwidth in GB/s (1e9 bytes/s, read + written) on 1 and ``threads`` threads."""
    n = nbytes // 4
    src = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    dst = np.empty_like(src)
    dst[...] = 1.0  # fault the pages in: the limit is the copy, not the kernel's page faults
    moved = 2 * src.nbytes
    one = time_cpu(lambda i: np.copyto(dst, src), reps=reps, warmup=2)
    result = {"bytes": moved, "gbps_1t": moved / one["median_s"] / 1e9, "threads": threads}
    if threads > 1:
        bounds = [n * k // threads for k in range(threads + 1)]
        chunks = [(dst[a:b], src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        with ThreadPoolExecutor(threads) as pool:
            def par(i):
                list(pool.map(lambda c: np.copyto(*c), chunks))
            many = time_cpu(par, reps=reps, warmup=2)
        result["gbps"] = moved / many["median_s"] / 1e9
    else:
        result["gbps"] = result["gbps_1t"]
    result["gbps"] = max(result["gbps"], result["gbps_1t"])
    return result


def device_copy(cp, nbytes: int = DEVICE_COPY_BYTES, reps: int = 30) -> dict:
    """Device-to-device copy bandwidth in GB/s (read + written), CUDA events."""
    n = nbytes // 4
    src = cp.random.RandomState(0).standard_normal(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = time_gpu(lambda i: cp.copyto(dst, src), CupyEvents(cp), reps=reps, warmup=3)
    moved = 2 * src.nbytes
    return {"bytes": moved, "gbps": moved / t["median_s"] / 1e9}
