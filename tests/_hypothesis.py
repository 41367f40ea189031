"""Hypothesis settings for gpuq's property tests: a fixed budget, reproducible in CI.

Profiles (registered here, used through :func:`run`; nothing is loaded globally):

* ``gpuq-dev`` (default): random examples, Hypothesis' example database in
  ``.hypothesis/`` (it ignores itself in git; a failure found once is tried
  first next time).
* ``gpuq-ci`` (when the environment variable ``CI`` is set, as ``.ci/run``
  runs): ``derandomize=True`` (the same examples every run, from the test's
  source), no database, the failing example's blob printed.

Every test asks for a fixed number of examples per backend (:data:`EXAMPLES`),
so CI time is bounded; ``GPUQ_FUZZ=N`` multiplies them by N for a longer
local search (``GPUQ_FUZZ=50 python -m pytest tests/test_properties.py``).
There is no deadline: the first call of a dtype combination compiles a numba
loop (about a second).
"""

from __future__ import annotations

import os
import re

from hypothesis import HealthCheck, given, settings

settings.register_profile(
    "gpuq-dev",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)
settings.register_profile("gpuq-ci", parent=settings.get_profile("gpuq-dev"), derandomize=True,
                          database=None)

PROFILE = "gpuq-ci" if os.environ.get("CI") else "gpuq-dev"
FUZZ = max(1, int(os.environ.get("GPUQ_FUZZ") or 1))

#: Examples per test and backend, as a share of what the test asks for. The cuda parameter
#: takes half: without a GPU it runs the kernels on the CPU (tests/cudasim), a few times slower
#: per example than the host loops (and the GPU has its own sweep, tests/test_cuda_sweep.py).
EXAMPLES = {"numpy": 1.0, "numba": 1.0, "cuda": 0.5}


def examples(n: int, backend_name: str = "numpy") -> int:
    """The example budget of a test that asks for ``n`` on the host loops."""
    return max(1, round(n * EXAMPLES.get(backend_name, 1.0) * FUZZ))


def run(check, strategy, n: int, backend=None) -> None:
    """Run ``check(backend, case)`` (``check(case)`` without a backend) on ``n`` examples of
    ``strategy``, scaled for the backend: the fixed example budget of one (test, backend) pair."""
    name = getattr(backend, "name", "host")

    def property_test(case):
        if backend is None:
            check(case)
        else:
            check(backend, case)

    # Hypothesis keys its example database and derandomized seed on the test's name and
    # source: one name per (check, backend), so no two of them share either.
    property_test.__name__ = property_test.__qualname__ = re.sub(r"\W", "_", f"{check.__name__}_{name}")
    test = settings(settings.get_profile(PROFILE), max_examples=examples(n, name))(
        given(strategy)(property_test))
    test()
