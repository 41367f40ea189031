"""The report rows of two runs that must agree: every key exactly, the SQNR to 1e-12.

The host's one pass (``gpuq.checkpoints.fused``) sums the float64 energies behind a SQNR in
another order than the multi-pass path (``--device cuda`` takes the latter): the same codes,
scales and max error, the SQNR equal but for its last digits (README, "One pass per weight").
"""

from __future__ import annotations

import pytest


def assert_same_rows(a: list, b: list) -> None:
    """Rows ``a`` and ``b`` (a report's ``"tensors"``) equal, the ``sqnr_db`` to 1e-12."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k != "sqnr_db"} == {k: v for k, v in rb.items() if k != "sqnr_db"}
        if rb.get("sqnr_db") is None:  # a kept tensor, or a dequantize row
            assert ra.get("sqnr_db") is None
        else:
            assert ra["sqnr_db"] == pytest.approx(rb["sqnr_db"], rel=1e-12, abs=0.0)
