"""Results out: the stamp, a terminal table, JSON, and a PNG plot.

Every artefact carries the same stamp: device name, date (UTC), git commit
('unknown' outside a repository), thread count, library versions.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess


def git_commit(root=None) -> str:
    """``git rev-parse HEAD`` of the repository (a '+dirty' suffix if modified); outside one,
    ``$GPUQ_COMMIT`` (the device tool sends a tree without .git), else 'unknown'."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        if sha.returncode != 0:
            return os.environ.get("GPUQ_COMMIT") or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("GPUQ_COMMIT") or "unknown"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict:
    import importlib

    out = {"python": platform.python_version()}
    for mod in ("numpy", "numba", "gpuq", "onnxruntime", "torch", "cupy"):
        try:
            m = importlib.import_module(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception:
            out[mod] = None
    return out


def stamp(device: str, device_name: str, threads, extra=None) -> dict:
    now = _dt.datetime.now(_dt.timezone.utc)
    s = {
        "device": device,
        "device_name": device_name,
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
        "threads": threads,
        "cpu_count": os.cpu_count(),
        "versions": _versions(),
    }
    s.update(extra or {})
    return s


def file_stem(st: dict) -> str:
    """``bench_cpu_AMD-EPYC-..._2t_2026-01-01T120000Z``: device, threads, date."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", st["device_name"]).strip("-")[:40]
    date = st["date"].replace(":", "")
    return f"bench_{st['device']}_{name}_{st['threads']}t_{date}"


def _fmt(v, spec):
    if v is None:
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return "-".rjust(int(width or 0))
    return format(v, spec)


def table(st: dict, rows: list) -> str:
    """A fixed-width table, one line per (case, contender)."""
    head = (f"gpuq bench | {st['device']}: {st['device_name']} | threads={st['threads']} | "
            f"{st['date']} | commit {st['commit']}"
            + (f" | host kernels: {st['host_kernels']}" if st.get("host_kernels") else "") + "\n"
            f"copy limit: {st['copy']['gbps']:.2f} GB/s (read + written)\n")
    cols = (f"{'case':<36}{'contender':<18}{'median':>11}{'GB/s':>8}{'%copy':>7}{'vs best':>8}"
            f"{'/static':>8}{'mism':>10}  status")
    lines = [head, cols, "-" * len(cols)]
    last = None
    for r in rows:
        if last is not None and r["case"] != last:
            lines.append("")
        last = r["case"]
        if r["status"] == "ok":
            med = (f"{r['median_s'] * 1e6:8.1f} us" if r["latency"] else f"{r['median_s'] * 1e3:8.2f} ms")
            bp = r.get("best_peer")
            lines.append(
                f"{r['case']:<36}{r['contender']:<18}{med:>11}{r['gbps']:8.2f}{_fmt(r['pct_copy'], '7.1f')}"
                f"{_fmt(r['ratio_to_best_peer'], '8.2f')}{_fmt(r.get('ratio_to_static'), '8.2f')}"
                f"{_fmt(r['mismatches'], '10d')}"
                f"  ok{'' if r['peer'] or not bp else f' (best peer: {bp})'}")
        else:
            lines.append(f"{r['case']:<36}{r['contender']:<18}{'':>11}{'':>8}{'':>7}{'':>8}{'':>8}{'':>10}"
                         f"  {r['status']}")
    lines.append("")
    lines.append("vs best = best peer's median time / this median (> 1: faster than every peer);"
                 " mism = elements that differ from gpuq's output (exact).")
    lines.append("/static (dyn/, qp/ cases) = this median / the median of 'gpuq static', a static"
                 " gpuq.quantize of the same tensor and scheme (issue 5's ratio; lower is better).")
    for name, why in st.get("missing_peers", []):
        lines.append(f"peer {name}: {why}")
    return "\n".join(lines)


def write_json(path, st, rows) -> None:
    with open(path, "w") as f:
        json.dump({"stamp": st, "rows": rows}, f, indent=1)


def write_png(path, st, rows) -> str | None:
    """% of copy bandwidth per case, gpuq vs peers (horizontal grouped bars).

    Returns None on success, or the reason no PNG was written (matplotlib missing).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'gpuq[bench]'): no PNG written"
    import numpy as np

    cases = []
    for r in rows:
        if not r["latency"] and r["case"] not in cases:
            cases.append(r["case"])
    names = []
    for r in rows:
        if r["contender"] not in names:
            names.append(r["contender"])
    if not cases:
        return "no bandwidth cases to plot"
    val = {(r["case"], r["contender"]): r.get("pct_copy") for r in rows if r["status"] == "ok"}
    h = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.09 * len(cases) * len(names) + 0.25 * len(cases)))
    y = np.arange(len(cases))
    colors = plt.get_cmap("tab10")
    for k, n in enumerate(names):
        vals = [val.get((c, n)) for c in cases]
        pos = y - 0.4 + h * (k + 0.5)
        ax.barh(pos, [v if v is not None else 0 for v in vals], height=h, label=n, color=colors(k),
                edgecolor="black" if n.startswith("gpuq") else None, linewidth=0.4)
        for p, v in zip(pos, vals):
            if v is None:
                ax.text(0.5, p, "n/a", va="center", fontsize=5, color="grey")
    ax.set_yticks(y)
    ax.set_yticklabels(cases, fontsize=7, family="monospace")
    ax.invert_yaxis()
    ax.axvline(100, color="black", lw=0.8, ls="--")
    ax.set_xlabel(f"% of measured copy bandwidth ({st['copy']['gbps']:.1f} GB/s, read + written)")
    ax.set_title(f"gpuq vs peers: {st['device']} {st['device_name']}, {st['threads']} thread(s)\n"
                 f"{st['date']}  commit {st['commit'][:12]}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
