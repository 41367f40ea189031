#!/usr/bin/env python3
"""Issue 38's device step, run right after ``bench/gpu_check.sh`` in the same GPU window: at most
three minutes of command, three parts, each under its own time limit, each writing one file into
``--out`` as it goes (a part killed at its limit loses nothing it wrote):

1. ``conformance38.txt`` (<= 60 s; estimated 30-40 s on an H100/H200): ``bench/gpu_conformance.py``:
   every hardware conversion against the software path it replaced and against the device port
   of the CPU execution's helper, over all 2**32 patterns; FastDivmod (mul.hi/clz) against integer
   division on every divisor below 2**16 and 2,000 above; the exact division from a reciprocal
   against ``div.rn`` on the second quarter of the 2**46 significand pairs (every fourth s
   significand from 1: gpu_check.sh's conformance step took those from 0; ~15 s estimated) and
   on every float32 at four scales.
2. ``headline38.json`` (<= 80 s): ``bench/gpu_headline.py`` on the cases issue 38 changed (bf16
   and fp8 per-row, int4 g128, the dynamic per-row rows, the 128x128 block rows), 256M
   elements, bits checked first, torch.compile peers while the part's deadline allows.
3. ``ncu38.csv`` (<= 40 s): Nsight Compute on two kernels, the read-once dynamic kernels
   (``dynamic_quantize_units`` for rows of 16384, ``dynamic_quantize_staged`` for rows of 32768)
   at 64M elements: duration, DRAM throughput and bytes, warp instructions; ``ncu38.txt`` turns
   them into instructions per element and % of DRAM peak. Skipped, and said so, without ``ncu``.

    python3 bench/gpu_issue38.py --out $OUT            # on the GPU machine
    python3 bench/gpu_issue38.py --out /tmp/x --sim    # a dry run: CPU execution, CPU torch

Exit status 1 if a conformance form or a headline bits check failed (or a part did not finish).
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The headline cases issue 38 changed (parts of bench/gpu_headline.py's case names).
CASES = "bf16->s8 per-row,f32->fp8e4m3 per-row,int4,dynamic,block128x128"
#: The two kernels Nsight Compute profiles, and the headline cases that launch them.
NCU_KERNELS = "regex:dynamic_quantize_(units|staged)"
NCU_CASES = "dynamic f32->s8 per-row unchecked,per-row x2 long"
NCU_ROWS, NCU_COLS = 4096, 16384  # 64M elements
NCU_METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "dram__bytes_read.sum", "dram__bytes_write.sum", "smsp__inst_executed.sum")
#: Seconds each part may take (the sum is the step's three minutes).
BUDGET = {"conformance": 60, "headline": 80, "ncu": 40}


def part(name: str, cmd: list, out: Path, limit: float, log) -> int:
    """Run ``cmd`` under ``limit`` seconds, its output into ``out``; returns its status (124: killed)."""
    t0 = time.perf_counter()
    with out.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    note = f" (killed at its {limit:.0f}s limit)" if rc == 124 else ""
    log(f"part {name}: rc {rc} in {time.perf_counter() - t0:.0f}s{note} -> {out.name}")
    return rc


def ncu_summary(text: str, elements: int) -> list:
    r"""Lines per profiled kernel from ``ncu --csv --print-units base`` output (nanoseconds, bytes):
    duration, DRAM % of peak and bytes per element, and SASS instructions per element (warp
    instructions x 32 / elements).

    >>> head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
    >>> rows = ''.join(f'"0","void k<float>(const float *)","{m}","u","{v}"\n' for m, v in
    ...                [("gpu__time_duration.sum", "250,000"), ("smsp__inst_executed.sum", "1000"),
    ...                 ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "91.5"),
    ...                 ("dram__bytes_read.sum", "4000"), ("dram__bytes_write.sum", "1000")])
    >>> ncu_summary("==PROF== noise\n" + head + rows, 1000)
    ['void k<float>: 250.0 us, DRAM 91.5% of peak, 5.00 B/elem, 32.0 instr/elem']
    """
    start = text.find('"ID"')
    if start < 0:
        return ["ncu: no metrics in its output"]
    rows = {}
    for r in csv.DictReader(io.StringIO(text[start:])):
        rows.setdefault((r["ID"], r["Kernel Name"]), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    lines = []
    for (_, kernel), m in rows.items():
        name = kernel.split("(")[0]
        lines.append(f"{name}: {m.get('gpu__time_duration.sum', float('nan')) / 1e3:.1f} us, DRAM "
                     f"{m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', float('nan')):.1f}% of peak, "
                     f"{(m.get('dram__bytes_read.sum', 0) + m.get('dram__bytes_write.sum', 0)) / elements:.2f} "
                     f"B/elem, {m.get('smsp__inst_executed.sum', float('nan')) * 32 / elements:.1f} instr/elem")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sim", action="store_true", help="a dry run: CPU execution of the kernels, CPU torch")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    logfile = (args.out / "issue38.log").open("w")

    def log(line):
        print(line, flush=True)
        logfile.write(line + "\n")
        logfile.flush()

    start = time.perf_counter()
    status = 0
    conf = [py, "bench/gpu_conformance.py", "--division-s-offset", "1"]  # gpu_check.sh took offset 0
    if args.sim:  # 2**10 patterns, every 2**21-th s significand: seconds, not the proof
        conf += ["--sim", "--log2-count", "10", "--division-log2-s", "21"]
    rc = part("conformance", conf, args.out / "conformance38.txt", BUDGET["conformance"] * (3 if args.sim else 1), log)
    status |= rc != 0
    bench = [py, "bench/gpu_headline.py", "--json", str(args.out / "headline38.json"), "--cases", CASES,
             "--deadline", str(BUDGET["headline"] - 10)]
    if args.sim:
        bench += ["--device", "cpu", "--rows", "128", "--cols", "256", "--reps", "1", "--rounds", "1",
                  "--check-rows", "4", "--no-compile"]
    rc = part("headline", bench, args.out / "headline38.txt", BUDGET["headline"] * (3 if args.sim else 1), log)
    status |= rc != 0
    ncu = shutil.which("ncu")
    if ncu is None:
        log("part ncu: skipped (no ncu on PATH)")
    else:
        cmd = [ncu, "--clock-control", "none", "--csv", "--print-units", "base", "--metrics", ",".join(NCU_METRICS),
               "-k", NCU_KERNELS,
               "-c", "2", py, "bench/gpu_headline.py", "--profile", "--rows", str(NCU_ROWS), "--cols",
               str(NCU_COLS), "--cases", NCU_CASES]
        rc = part("ncu", cmd, args.out / "ncu38.csv", BUDGET["ncu"], log)
        lines = ncu_summary((args.out / "ncu38.csv").read_text(errors="replace"), NCU_ROWS * NCU_COLS)
        (args.out / "ncu38.txt").write_text("\n".join(lines) + "\n")
        for line in lines:
            log(f"  {line}")
    log(f"done in {time.perf_counter() - start:.0f}s, status {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
