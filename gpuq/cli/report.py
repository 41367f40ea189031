"""The report ``gpuq quantize`` prints: a table for people, or JSON with ``--json``.

JSON numbers are plain JSON: bytes are exact integers, ``sqnr_db`` and
``max_abs_error`` floats; a non-finite value is written as the string
``"inf"`` (an exact round trip), ``"-inf"`` or ``"nan"`` (NaN in the input),
since strict JSON has no such numbers. Tensors that were kept in float have
``"quantized": false`` and ``null`` error fields.
"""

from __future__ import annotations

import json
import math


def human_bytes(n: int) -> str:
    """Binary units, one decimal.

    >>> human_bytes(512), human_bytes(131072), human_bytes(3 * 2**30)
    ('512 B', '128.0 KiB', '3.0 GiB')
    """
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


def _db(v) -> str:
    if v is None:
        return ""
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.2f}"


def _err(v) -> str:
    return "" if v is None else f"{v:.3g}"


def _shape(shape) -> str:
    return "x".join(map(str, shape)) if shape else "()"


def format_table(report: dict) -> str:
    """The quantize report as an aligned text table with a total line.

    One row per quantized tensor; the tensors kept in float share one row.
    """
    rows = []
    kept = [t for t in report["tensors"] if not t["quantized"]]
    for t in report["tensors"]:
        if t["quantized"]:
            rows.append([t["name"], _shape(t["shape"]), t["scheme_text"],
                         human_bytes(t["bytes_before"]), human_bytes(t["bytes_after"]),
                         _db(t["sqnr_db"]), _err(t["max_abs_error"])])
    if kept:
        size = sum(t["bytes_before"] for t in kept)
        rows.append([f"({len(kept)} kept as they are)", "", "unchanged",
                     human_bytes(size), human_bytes(size), "", ""])
    tot = report["total"]
    ratio = tot["bytes_after"] / tot["bytes_before"] if tot["bytes_before"] else 1.0
    total = [f"total: {tot['quantized']} quantized, {tot['kept']} kept", "", f"{ratio:.1%} of the bytes",
             human_bytes(tot["bytes_before"]), human_bytes(tot["bytes_after"]),
             _db(tot["sqnr_db"]), _err(tot["max_abs_error"])]
    header = ["tensor", "shape", "scheme", "before", "after", "SQNR dB", "max abs err"]
    table = [header] + rows + [total]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    right = {3, 4, 5, 6}  # numbers align right

    def line(r):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    title = f"gpuq quantize: {report['input']} -> {report['output']} (device: {report['device']})"
    return "\n".join([title, "", line(header), rule] + [line(r) for r in rows]
                     + [rule, line(total)])


def format_dequantize(report: dict) -> str:
    """One summary line for ``gpuq dequantize``."""
    tot = report["total"]
    return (f"gpuq dequantize: {report['input']} -> {report['output']} "
            f"(device: {report['device']}): restored {tot['quantized']}, "
            f"kept {tot['kept']}, {human_bytes(tot['bytes_before'])} -> "
            f"{human_bytes(tot['bytes_after'])}")


def to_json(report: dict) -> str:
    """The report as strict JSON (non-finite floats as strings).

    >>> to_json({"sqnr_db": float("inf"), "x": [1.5, float("nan")]})
    '{"sqnr_db": "inf", "x": [1.5, "nan"]}'
    """
    return json.dumps(_finite(report), allow_nan=False)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
