"""Markdown tables from result JSONs: ``python -m bench.summary FILE.json [FILE.json ...]``.

One table per file: a line per case, the median time of each contender in ms
(us for latency cases), gpuq's % of copy, and gpuq's ratio to the best peer
(best peer time / gpuq time: >= 0.5 meets the "within 2x" target, > 1 is faster),
and the same ratio for ``gpuq out=``.
Used to write bench/NOTES.md from measured files rather than by hand.
Issue-5 cases (``dyn/``, ``qp/``) get a second table: static quantize,
gpuq, each peer, and the ratio to the static quantize (``bench.dynamic``).
"""

from __future__ import annotations

import json
import sys

from .dynamic import markdown as dynamic_markdown


def markdown(doc: dict) -> str:
    st, all_rows = doc["stamp"], doc["rows"]
    rows = [r for r in all_rows if not r.get("dynamic")]
    names = []
    for r in rows:
        if r["contender"] not in names:
            names.append(r["contender"])
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["contender"]] = r
    out = [f"{st['device']} {st['device_name']}, {st['threads']} thread(s), {st['date']}, commit "
           f"{st['commit'][:12]}; copy {st['copy']['gbps']:.1f} GB/s (1 thread: "
           f"{st['copy'].get('gbps_1t', st['copy']['gbps']):.1f})", ""]
    dyn = dynamic_markdown(all_rows)
    if not rows:
        return "\n".join(out + [dyn])
    out.append("| case | " + " | ".join(names)
               + " | gpuq % copy | gpuq / best peer | out= / best peer | best peer | peer mismatches |")
    out.append("|---" * (len(names) + 6) + "|")
    for case, cs in by_case.items():
        cells = []
        for n in names:
            r = cs.get(n)
            if r is None or r["status"] != "ok":
                cells.append("n/a")
            elif r["latency"]:
                cells.append(f"{r['median_s'] * 1e6:.1f} us")
            else:
                cells.append(f"{r['median_s'] * 1e3:.1f}")
        g = cs.get("gpuq", {})
        pct = g.get("pct_copy")
        ratio = g.get("ratio_to_best_peer")
        ratio_out = cs.get("gpuq out=", {}).get("ratio_to_best_peer")
        mism = ", ".join(f"{n}: {r['mismatches']}" for n, r in cs.items()
                         if r["peer"] and r["status"] == "ok" and r["mismatches"])
        out.append(f"| `{case}` | " + " | ".join(cells)
                   + f" | {'-' if pct is None else f'{pct:.1f}'} | {'-' if ratio is None else f'{ratio:.2f}'}"
                   + f" | {'-' if ratio_out is None else f'{ratio_out:.2f}'}"
                   + f" | {g.get('best_peer') or '-'} | {mism or '0'} |")
    if dyn:
        out += ["", dyn]
    return "\n".join(out)


def main(argv=None) -> int:
    for path in (argv if argv is not None else sys.argv[1:]):
        with open(path) as f:
            print(markdown(json.load(f)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
