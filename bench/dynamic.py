"""Issue 5's summary: ``quantize_dynamic`` and ``choose_qparams`` against a static quantize.

The cases themselves (``dyn/...`` and ``qp/...`` in ``bench.cases``) run in
the main loop with their peers; every row of such a case carries
``ratio_to_static``: its median time over the median of ``gpuq static``, a
static ``gpuq.quantize`` of the same tensor with the same scheme (its
qparams from ``choose_qparams``, computed before timing). Issue 5's targets:
``quantize_dynamic`` per-tensor <= 2.2x, per-row (per-token) <= 1.3x.

GB/s counts the bytes of the quantize itself for every row of these cases
(``Case.bytes_moved``: ``x`` read once, codes + scales/zps written once), so
the column compares across the rows of a case and with the main table.

This module only formats: :func:`table` (terminal) and :func:`markdown`
(``bench.summary``, NOTES.md) from the rows. ``r(min)`` is the ratio of the
minimum times: on a noisy host the fresh 64 MiB output of both quantize
calls page-faults at a cost that varies call to call (bimodal, up to ~2x),
which moves the medians more than the mins.
"""

from __future__ import annotations

from .contenders import GpuqStatic


def _dynamic_rows(rows):
    return [r for r in rows if r.get("dynamic")]


def _verdict(r):
    t = r.get("target")
    if not t or r.get("ratio_to_static") is None:
        return ""
    return "met" if r["ratio_to_static"] <= t else "MISSED"


def _way(r):
    if r["contender"] == GpuqStatic.name:
        return "static quantize"
    if r["contender"] == "gpuq":
        return "quantize_dynamic" if r["op"] == "dynamic" else "choose_qparams"
    return r["contender"]


def table(rows) -> str:
    """A terminal table of the issue-5 rows (empty string if there are none)."""
    dyn = _dynamic_rows(rows)
    if not dyn:
        return ""
    lines = ["", "", "qparams from data (issue 5): ratio = time / static gpuq.quantize of the same tensor, "
                 "same scheme; GB/s = the quantize's bytes",
             f"{'case':<30} {'contender':<24} {'ms':>9} {'GB/s':>7} {'ratio':>6} {'r(min)':>6} {'target':>7}"
             f" {'mism':>9}"]
    last = None
    for r in dyn:
        if last is not None and r["case"] != last:
            lines.append("")
        last = r["case"]
        if r["status"] != "ok":
            lines.append(f"{r['case']:<30} {_way(r):<24} {r['status']}")
            continue
        target = f"<={r['target']}" if r.get("target") else ""
        lines.append(f"{r['case']:<30} {_way(r):<24} {r['median_s'] * 1e3:9.3f} {r['gbps']:7.2f} "
                     f"{r['ratio_to_static']:6.2f} {r['ratio_to_static_min']:6.2f} {target:>7} "
                     f"{r['mismatches']:>9} {_verdict(r)}")
    return "\n".join(lines)


def markdown(rows) -> str:
    """One markdown line per issue-5 case: static, gpuq and peer times, gpuq's ratio and target."""
    dyn = _dynamic_rows(rows)
    if not dyn:
        return ""
    peers = []
    for r in dyn:
        if r["peer"] and r["contender"] not in peers:
            peers.append(r["contender"])
    by_case = {}
    for r in dyn:
        by_case.setdefault(r["case"], {})[r["contender"]] = r
    out = ["| case | static quantize ms | gpuq ms | gpuq / static | (min / min) | target | gpuq GB/s | "
           + " | ".join(f"{p} ms (/ static)" for p in peers) + " | mismatches |",
           "|---" * (8 + len(peers)) + "|"]
    for case, cs in by_case.items():
        st, g = cs.get(GpuqStatic.name), cs.get("gpuq")

        def ms(r):
            return "n/a" if r is None or r["status"] != "ok" else f"{r['median_s'] * 1e3:.1f}"

        cells = [ms(st), ms(g)]
        ok = g is not None and g["status"] == "ok" and g.get("ratio_to_static") is not None
        cells.append(f"**{g['ratio_to_static']:.2f}**" if ok else "-")
        cells.append(f"{g['ratio_to_static_min']:.2f}" if ok else "-")
        cells.append(f"<= {g['target']} ({_verdict(g)})" if ok and g.get("target") else "-")
        cells.append(f"{g['gbps']:.2f}" if ok else "-")
        for p in peers:
            r = cs.get(p)
            cells.append(f"{ms(r)} ({r['ratio_to_static']:.2f})" if r and r["status"] == "ok"
                         and r.get("ratio_to_static") else "n/a")
        mism = ", ".join(f"{n}: {r['mismatches']}" for n, r in cs.items()
                         if r["status"] == "ok" and r["mismatches"])
        out.append(f"| `{case}` | " + " | ".join(cells) + f" | {mism or '0'} |")
    return "\n".join(out)
