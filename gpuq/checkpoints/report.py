"""The report ``gpuq quantize`` prints: a table for people, or JSON with ``--json``.

Rows are in natural order of the tensor names (``layers.2`` before
``layers.10``). JSON numbers are plain JSON numbers: bytes are exact
integers, ``sqnr_db`` and ``max_abs_error`` floats. A value that JSON has no
number for (``sqnr_db`` is +Inf when the round trip is exact) is written as
``null`` with the reason beside it under ``<key>_reason``; never as a string.
Tensors that were kept in float have ``"quantized": false`` and ``null``
error fields. ``nonfinite`` counts each quantized tensor's NaN, +Inf and -Inf
values; SQNR and max error are over its finite values. ``default_scheme`` words
the defaults table's rule for the code type when the schemes came from it
(no --axis, --per-tensor or --group-size), and is null otherwise. A kept tensor
with a ``reason`` (a serving format's MoE routers) has a row of its own in the
table, the reason in the scheme column.
"""

from __future__ import annotations

import json
import math
import re


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
    if v is None or math.isnan(v):
        return ""
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.2f}"


def _err(v) -> str:
    return "" if v is None or math.isnan(v) else f"{v:.3g}"


def _shape(shape) -> str:
    return "x".join(map(str, shape)) if shape else "()"


def format_table(report: dict) -> str:
    """The quantize report as an aligned text table with a total line.

    One row per quantized tensor; the tensors kept in float share one row.
    """
    rows = []
    kept = [t for t in report["tensors"] if not t["quantized"] and not t.get("reason")]
    # A serving format's report adds one column (its title, the rows' key): vLLM's shape check.
    title, key = report.get("extra_column") or (None, None)
    extra = [] if key is None else [""]
    for t in report["tensors"]:
        if t["quantized"]:
            rows.append([t["name"], _shape(t["shape"]), t["scheme_text"],
                         human_bytes(t["bytes_before"]), human_bytes(t["bytes_after"]),
                         _db(t["sqnr_db"]), _err(t["max_abs_error"])] + ([t[key]] if key else []))
        elif t.get("reason"):
            rows.append([t["name"], _shape(t["shape"]), t["reason"], human_bytes(t["bytes_before"]),
                         human_bytes(t["bytes_after"]), "", ""] + ([t.get(key) or "-"] if key else []))
    if kept:
        size = sum(t["bytes_before"] for t in kept)
        rows.append([f"({len(kept)} kept as they are)", "", "unchanged",
                     human_bytes(size), human_bytes(size), "", ""] + extra)
    tot = report["total"]
    ratio = tot["bytes_after"] / tot["bytes_before"] if tot["bytes_before"] else 1.0
    total = [f"total: {tot['quantized']} quantized, {tot['kept']} kept", "", f"{ratio:.1%} of the bytes",
             human_bytes(tot["bytes_before"]), human_bytes(tot["bytes_after"]),
             _db(tot["sqnr_db"]), _err(tot["max_abs_error"])] + extra
    header = ["tensor", "shape", "scheme", "before", "after", "SQNR dB", "max abs err"] + ([title] if key else [])
    table = [header] + rows + [total]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    right = {3, 4, 5, 6}  # numbers align right

    def line(r):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    fmt = f"{report['format']}, " if report.get("format") else ""
    title = f"gpuq quantize: {report['input']} -> {report['output']} ({fmt}device: {report['device']})"
    return "\n".join([title, "", line(header), rule] + [line(r) for r in rows]
                     + [rule, line(total)] + default_notes(report) + calibrate_notes(report)
                     + nonfinite_notes(report) + list(report.get("notes") or ()))


def calibrate_notes(report: dict) -> list:
    """The line saying how the scales were chosen, where it is not min/max (the default).

    >>> calibrate_notes({"calibrate": "mse"})
    ['note: scales by the MSE search (--calibrate mse): per block, the best of 20 shrunken ranges']
    >>> calibrate_notes({"calibrate": "minmax"})
    []
    """
    if report.get("calibrate", "minmax") == "minmax":
        return []
    return ["note: scales by the MSE search (--calibrate mse): per block, the best of 20 shrunken ranges"]


def default_notes(report: dict) -> list:
    """The line saying the schemes are the defaults (when they are), for the table.

    >>> default_notes({"default_scheme": "int4: groups of 128 along the last dimension"})
    ['note: default scheme (no --axis, --per-tensor, --group-size) for int4: groups of 128 along the last dimension']
    """
    rule = report.get("default_scheme")
    return [f"note: default scheme (no --axis, --per-tensor, --group-size) for {rule}"] if rule else []


def format_dequantize(report: dict) -> str:
    """One summary line for ``gpuq dequantize``, then the report's notes, one line each."""
    tot = report["total"]
    fmt = f"{report['format']}, " if report.get("format") else ""
    return (f"gpuq dequantize: {report['input']} -> {report['output']} "
            f"({fmt}device: {report['device']}): restored {tot['quantized']}, "
            f"kept {tot['kept']}, {human_bytes(tot['bytes_before'])} -> "
            f"{human_bytes(tot['bytes_after'])}" + "".join("\n" + n for n in report.get("notes") or ()))


def natural_key(name: str) -> tuple:
    """Sort key that orders the numbers in a name by value.

    >>> sorted(["layers.10.w", "layers.2.w", "embed"], key=natural_key)
    ['embed', 'layers.2.w', 'layers.10.w']
    """
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", name) if part)


def nonfinite_text(counts: dict) -> str:
    """``3 non-finite values (2 NaN, 1 +Inf)``.

    >>> nonfinite_text({"nan": 2, "posinf": 0, "neginf": 1})
    '3 non-finite values (2 NaN, 1 -Inf)'
    """
    parts = [f"{counts[k]} {label}" for k, label in
             (("nan", "NaN"), ("posinf", "+Inf"), ("neginf", "-Inf")) if counts[k]]
    total = sum(counts.values())
    return f"{total} non-finite value{'s' if total != 1 else ''} ({', '.join(parts)})"


def nonfinite_notes(report: dict) -> list:
    """One line per quantized tensor that held NaN or +/-Inf (for the table)."""
    notes = []
    for t in report["tensors"]:
        counts = t.get("nonfinite")
        if t["quantized"] and counts and sum(counts.values()):
            notes.append(f"note: {t['name']} has {nonfinite_text(counts)}: scales from its "
                         f"finite values, SQNR and max abs err over those")
    return notes


def to_json(report: dict) -> str:
    """The report as strict JSON: non-finite floats become ``null`` plus a ``<key>_reason``.

    >>> to_json({"sqnr_db": float("inf"), "max_abs_error": 0.5})
    '{"sqnr_db": null, "sqnr_db_reason": "+Inf: exact round trip (the error is 0)", "max_abs_error": 0.5}'
    """
    return json.dumps(_finite(report), allow_nan=False)


_REASONS = {
    ("sqnr_db", "+Inf"): "+Inf: exact round trip (the error is 0)",
    ("sqnr_db", "-Inf"): "-Inf: the values are all 0 but their round trip is not",
    ("sqnr_db", "NaN"): "NaN: no finite values to compare",
    ("max_abs_error", "NaN"): "NaN: no finite values to compare",
}


def _finite(obj):
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if isinstance(value, float) and not math.isfinite(value):
                kind = "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
                out[key] = None
                out[f"{key}_reason"] = _REASONS.get(
                    (key, kind), f"{kind}, which JSON has no number for")
            else:
                out[key] = _finite(value)
        return out
    if isinstance(obj, (list, tuple)):
        # No key to hang a reason on: a bare non-finite float in a list is null.
        return [None if isinstance(v, float) and not math.isfinite(v) else _finite(v)
                for v in obj]
    return obj
