"""Timers: host wall clock for the CPU, CUDA events for the GPU.

Every timer warms up first (module loads, kernel compilation, first-touch of
scratch and pools stay out of the numbers) and reports the median of the
repetitions, with the min and max beside it so the spread is visible.
"""

from __future__ import annotations

import statistics
import time


def _summary(times) -> dict:
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "reps": len(times),
    }


def time_cpu(fn, *, reps: int = 5, warmup: int = 1, inner: int = 1) -> dict:
    """Median wall time of ``fn(i)`` (``i`` counts calls, for input rotation).

    With ``inner > 1`` each repetition times ``inner`` back-to-back calls and
    reports the per-call mean of that loop (for microsecond latencies).
    """
    i = 0
    for _ in range(warmup):
        fn(i)
        i += 1
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(i)
            i += 1
        times.append((time.perf_counter() - t0) / inner)
    return _summary(times)


class CupyEvents:
    """CUDA events on CuPy's current stream."""

    def __init__(self, cp):
        self.cp = cp

    def pair(self):
        return self.cp.cuda.Event(), self.cp.cuda.Event()

    def record(self, ev):
        ev.record()

    def elapsed_s(self, a, b) -> float:
        b.synchronize()
        return self.cp.cuda.get_elapsed_time(a, b) / 1e3

    def sync(self):
        self.cp.cuda.get_current_stream().synchronize()


class TorchEvents:
    """CUDA events on PyTorch's current stream (for the torch contenders)."""

    def __init__(self, torch):
        self.torch = torch

    def pair(self):
        E = self.torch.cuda.Event
        return E(enable_timing=True), E(enable_timing=True)

    def record(self, ev):
        ev.record()

    def elapsed_s(self, a, b) -> float:
        b.synchronize()
        return a.elapsed_time(b) / 1e3

    def sync(self):
        self.torch.cuda.synchronize()


def time_gpu(fn, events, *, reps: int = 50, warmup: int = 5) -> dict:
    """Median device time of ``fn(i)`` between two CUDA events, one pair per call.

    ``fn(i)`` should pick its input by ``i`` (rotation among buffers larger
    than L2), so no repetition reads what the previous one left in cache.
    """
    i = 0
    for _ in range(warmup):
        fn(i)
        i += 1
    events.sync()
    pairs = [events.pair() for _ in range(reps)]
    for a, b in pairs:
        events.record(a)
        fn(i)
        events.record(b)
        i += 1
    times = [events.elapsed_s(a, b) for a, b in pairs]
    return _summary(times)


def time_gpu_wall(fn, events, *, reps: int = 20, inner: int = 200, warmup: int = 20) -> dict:
    """Per-call wall time of ``inner`` back-to-back calls plus one synchronisation.

    For small tensors: it counts Python dispatch and launch overhead, which
    is what a caller of a 4096-element op pays.
    """
    for i in range(warmup):
        fn(i)
    events.sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(inner):
            fn(i)
        events.sync()
        times.append((time.perf_counter() - t0) / inner)
    return _summary(times)
