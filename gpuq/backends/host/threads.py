"""The host backend's threads: a small pool, per-thread scratch, and running block plans on them.

A call's blocks (:mod:`.blocks`) are cut into contiguous shares, one per thread; the calling
thread takes the first. Per-thread scratch buffers are allocated once per (key, dtype) and
reused, so the extra memory of a call is bounded by a few blocks per thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import blocks

#: Tensors smaller than this run on the calling thread only.
PARALLEL_MIN = 1 << 17


class Scratch(threading.local):
    """Per-thread block buffers, allocated once per (key, dtype)."""

    def __init__(self):
        self.buffers = {}

    def buffer(self, key, dtype, size):
        """A flat buffer of at least ``size`` elements (grown, never shrunk)."""
        buf = self.buffers.get((key, dtype))
        if buf is None or buf.size < size:
            buf = self.buffers[(key, dtype)] = np.empty(max(size, blocks.BLOCK), dtype)
        return buf[:size]

    def like(self, key, dtype, block):
        """A scratch view of ``dtype`` with the shape of ``block``."""
        return self.buffer(key, dtype, block.size).reshape(block.shape)


scratch = Scratch()
_pool_lock = threading.Lock()
_pool = None
_num_threads = None


def get_num_threads() -> int:
    """Threads the NumPy backend uses (default: the CPUs this process may use).

    On a thread inside :func:`thread_share`, the share given there.

    >>> import gpuq
    >>> gpuq.get_num_threads() >= 1
    True
    """
    total = _process_threads()
    share = _share.n
    return total if share is None else max(1, min(share, total))


def _process_threads() -> int:
    global _num_threads
    if _num_threads is None:
        env = os.environ.get("GPUQ_NUM_THREADS")
        _num_threads = int(env) if env else len(os.sched_getaffinity(0))
    return _num_threads


def set_num_threads(n: int) -> None:
    """Set the NumPy backend's thread count (``1`` runs on the calling thread).

    >>> import gpuq
    >>> gpuq.set_num_threads(2); gpuq.get_num_threads()
    2
    """
    global _num_threads, _pool
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    with _pool_lock:
        _num_threads = int(n)
        if _pool is not None:
            _pool.shutdown(wait=True)
            _pool = None


class _Share(threading.local):
    n = None


_share = _Share()


@contextlib.contextmanager
def thread_share(n: int):
    """Calls made on this thread inside the block use at most ``n`` of the process's threads
    (nested: the smaller share).

    For callers that run several gpuq calls at once on threads of their own (a
    Dask worker's tasks): each call takes its share instead of all the threads.

    >>> import gpuq
    >>> from gpuq.backends.host.threads import thread_share
    >>> with thread_share(1):
    ...     gpuq.get_num_threads()
    1
    """
    before = _share.n
    _share.n = n if before is None else min(n, before)
    try:
        yield
    finally:
        _share.n = before


def executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # Sized for the process, not for the first caller: a caller with a share uses part of it.
            _pool = ThreadPoolExecutor(max_workers=max(1, _process_threads() - 1), thread_name_prefix="gpuq")
        return _pool


def run_blocks(plans, block_fn) -> None:
    """Run ``block_fn(xb, ob, params, scratch)`` on every block of ``plans``, shared among the threads."""
    work = [(p, b) for p in plans for b in range(p.nblocks)]
    threads = min(get_num_threads(), len(work))
    total = sum(p.size for p in plans)
    if threads <= 1 or total < PARALLEL_MIN:
        run_range(work, block_fn)
        return
    bounds = _shares(plans, threads)
    pool = executor()
    futures = [pool.submit(run_range, work[bounds[i]:bounds[i + 1]], block_fn)
               for i in range(1, threads)]
    run_range(work[bounds[0]:bounds[1]], block_fn)
    for f in futures:
        f.result()


def _shares(plans, threads) -> list:
    """Where each thread's contiguous share of the blocks of ``plans`` starts and ends: about
    equal elements each, a plan's blocks weighing its size over its block count.

    Not equal block counts: the reductions cut every piece of a scheme into as many units
    (``qparams._ReducePlan``), so a ragged scheme's small edge pieces weighed as much as its
    main piece, and one thread reduced the main piece alone.

    >>> from types import SimpleNamespace as P
    >>> _shares([P(size=800, nblocks=8), P(size=8, nblocks=8)], 2)
    [0, 4, 16]
    """
    counts = [p.nblocks for p in plans]
    weights = np.repeat([p.size / max(n, 1) for p, n in zip(plans, counts)], counts)
    ends = np.cumsum(weights)
    # The blocks that end within each share (equal weights: len(work) * i // threads, as before).
    cuts = np.searchsorted(ends, ends[-1] * (1 + 1e-9) * np.arange(1, threads) / threads, side="right")
    return [0, *(int(c) for c in cuts), len(weights)]


def run_range(work, block_fn) -> None:
    """Run ``block_fn`` on the ``(plan, block)`` pairs of ``work`` on this thread."""
    local = scratch
    # Overflow to +/-Inf (a huge x / s, a float16 output out of range) is the
    # contract's answer, not an accident worth a warning.
    with np.errstate(over="ignore", invalid="ignore"):
        for plan, b in work:
            xb, ob, params = plan.block(b, local)
            block_fn(xb, ob, params, local)
