"""Timers: host wall clock for the CPU, CUDA events for the GPU.

Every timer warms up first (module loads, kernel compilation, first-touch of
scratch and pools stay out of the numbers) and reports the median of the
repetitions, with the min and max beside it so the spread is visible.
GPU event timings hide the host's dispatch behind a short spin kernel queued
before each call (see :func:`time_gpu`); latency cases use wall time instead.
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


#: Spin before each timed GPU call: at least this long, and this many times the host's
#: enqueue time of one call (measured on the warm-ups), at most SPIN_MAX_S.
SPIN_MIN_S = 50e-6
SPIN_FACTOR = 3.0
SPIN_MAX_S = 20e-3

_SPIN_SRC = r"""
extern "C" __global__ void gpuq_bench_spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (static_cast<long long>(t - t0) < ns);
}
"""


def _spin_ok(events, spin, request_s=200e-6) -> bool:
    """Whether ``spin(request_s)`` keeps the stream busy for about that long (one check)."""
    spin(0.0)  # compile / load outside the measurement
    events.sync()
    a, b = events.pair()
    events.record(a)
    spin(request_s)
    events.record(b)
    got = events.elapsed_s(a, b)
    return 0.5 * request_s <= got <= 20 * request_s


class CupyEvents:
    """CUDA events on CuPy's current stream."""

    def __init__(self, cp):
        self.cp = cp
        self._spin_kernel = None  # None: not built yet; False: unavailable

    def pair(self):
        return self.cp.cuda.Event(), self.cp.cuda.Event()

    def record(self, ev):
        ev.record()

    def elapsed_s(self, a, b) -> float:
        b.synchronize()
        return self.cp.cuda.get_elapsed_time(a, b) / 1e3

    def sync(self):
        self.cp.cuda.get_current_stream().synchronize()

    def _launch_spin(self, seconds):
        import numpy as np

        self._spin_kernel((1,), (1,), (np.int64(int(seconds * 1e9)),))

    def spin(self, seconds) -> bool:
        """Keep CuPy's current stream busy for ``seconds`` (one thread reading %globaltimer).
        False (nothing launched) where that cannot be done."""
        if self._spin_kernel is None:
            try:
                self._spin_kernel = self.cp.RawKernel(_SPIN_SRC, "gpuq_bench_spin")
                if not _spin_ok(self, self._launch_spin):
                    self._spin_kernel = False
            except Exception:
                self._spin_kernel = False
        if self._spin_kernel is False:
            return False
        self._launch_spin(seconds)
        return True


class TorchEvents:
    """CUDA events on PyTorch's current stream (for the torch contenders)."""

    def __init__(self, torch):
        self.torch = torch
        self._cycles_per_s = None  # None: not calibrated yet; 0: unavailable

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

    def spin(self, seconds) -> bool:
        """Keep torch's current stream busy for ``seconds`` (``torch.cuda._sleep``, calibrated
        once against CUDA events). False (nothing launched) where that cannot be done."""
        if self._cycles_per_s is None:
            self._cycles_per_s = 0
            try:
                sleep = self.torch.cuda._sleep
                cycles = 2_000_000
                sleep(1000)
                self.sync()
                a, b = self.pair()
                self.record(a)
                sleep(cycles)
                self.record(b)
                rate = cycles / self.elapsed_s(a, b)
                self._cycles_per_s = rate
                if not _spin_ok(self, lambda s: sleep(int(s * rate))):
                    self._cycles_per_s = 0
            except Exception:
                self._cycles_per_s = 0
        if not self._cycles_per_s:
            return False
        self.torch.cuda._sleep(int(seconds * self._cycles_per_s))
        return True


def time_gpu(fn, events, *, reps: int = 50, warmup: int = 5) -> dict:
    """Median device time of ``fn(i)`` between two CUDA events, one pair per call.

    ``fn(i)`` should pick its input by ``i`` (rotation among buffers larger
    than L2), so no repetition reads what the previous one left in cache.

    Before each timed call the stream is kept busy by a short spin kernel
    (``events.spin``; as NVBench's blocking kernel), long enough for the host
    to enqueue ``record(a); fn(i); record(b)`` meanwhile: the events then
    bracket the device work only, not Python's dispatch and launch latency
    (which would otherwise be most of a small call's time: a few us of
    kernel against tens of us of host work). ``launch_hidden`` in the
    result says whether that was done; ``spin_s`` how long each spin was.
    A call that synchronises inside (e.g. a flag read back) still pays
    whatever host time follows its synchronisation.
    """
    i = 0
    host = []
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn(i)
        host.append(time.perf_counter() - t0)
        i += 1
    events.sync()
    enqueue_s = statistics.median(host[1:] or host) if host else 0.0  # the first may compile
    spin_s = min(max(SPIN_FACTOR * enqueue_s, SPIN_MIN_S), SPIN_MAX_S)
    spin = getattr(events, "spin", None)
    hidden = spin is not None
    pairs = [events.pair() for _ in range(reps)]
    for a, b in pairs:
        if hidden:
            hidden = bool(spin(spin_s))
        events.record(a)
        fn(i)
        events.record(b)
        i += 1
    times = [events.elapsed_s(a, b) for a, b in pairs]
    out = _summary(times)
    out["launch_hidden"] = hidden
    out["spin_s"] = spin_s if hidden else 0.0
    out["host_enqueue_s"] = enqueue_s
    return out


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
