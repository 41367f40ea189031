"""Registers, spills, local memory and global load/store widths of every gpuq kernel, from the compiler.

No GPU is needed. Every instantiation is compiled exactly as the library compiles it
(:mod:`gpuq.backends.cuda.nvrtc_check`: the same expanded source, ``registry.OPTIONS`` and
name expressions) for one SASS target (default ``sm_90``), and then:

* ptxas ``-v`` (passed through NVRTC as ``-Xptxas=-v``; the SASS is the same without
  it): registers, stack frame, spill stores and loads;
* ``cuobjdump -res-usage``: shared memory (including the 1 KiB the driver reserves per
  block on sm_80+) and ``constant[0]`` (kernel parameters) bytes;
* ``nvdisasm -c`` (the SASS): the memory instructions by kind and width (static counts: the
  vector path and the scalar head/tail path are both in the code), ``CALL.REL`` targets,
  and for quantize/dequantize an estimate of the SASS instructions issued per element
  on the steady-state path (a full 16-element unit, 16-byte vectors on both sides,
  no float-division slow path, 32-bit divisions, no scale reload, no odometer carry);
* theoretical occupancy at 256 threads per block (per SM: 65536 registers, 2048 threads,
  32 blocks; 228 KiB shared memory on sm_90, 164 KiB on sm_80).

Kernels whose figures are all equal share one row.

The tools go in a scratch virtual environment, never in the project's:

    python3 -m venv /tmp/cudatools
    /tmp/cudatools/bin/pip install numpy 'nvidia-cuda-nvrtc>=13,<14' \
        nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    /tmp/cudatools/bin/python bench/kernel_resources.py                 # from the repo root
    /tmp/cudatools/bin/python bench/kernel_resources.py --arch sm_80
    /tmp/cudatools/bin/python bench/kernel_resources.py --sass 'quantize<float, signed char, float, false, 0>'

``$CUOBJDUMP`` and ``$NVDISASM`` (paths) override where the tools are looked for,
``$GPUQ_NVRTC`` where libnvrtc is. Without a tool it says which is missing and exits 0.
"""

from __future__ import annotations

import argparse
import collections
import glob
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuq.backends.cuda import nvrtc_check, registry

THREADS = 256
#: Per-SM limits (CUDA occupancy calculator): registers, threads, blocks, shared memory.
LIMITS = {"sm_80": {"regs": 65536, "threads": 2048, "blocks": 32, "smem": 164 * 1024},
          "sm_90": {"regs": 65536, "threads": 2048, "blocks": 32, "smem": 228 * 1024}}
SM = LIMITS["sm_90"]
_SHORT = {"float": "f32", "__half": "f16", "gpuq_bf16": "bf16", "double": "f64", "signed char": "s8",
          "unsigned char": "u8"}
_MAPS = {str(v): k for k, v in registry.MAPS.items()}


def find_tool(name: str) -> str | None:
    """``$NAME`` (upper case, a path), else NVIDIA's wheels (``nvidia/*/bin``), else ``PATH``."""
    env = os.environ.get(name.upper())
    if env and Path(env).is_file():
        return env
    hits = []
    try:
        import nvidia  # namespace package of NVIDIA's wheels (nvidia-cuda-cuobjdump, -nvdisasm)

        for root in nvidia.__path__:
            hits += sorted(glob.glob(os.path.join(root, "*", "bin", name)))
    except ImportError:
        pass
    return hits[0] if hits else shutil.which(name)


def short_name(expr: str) -> str:
    """``gpuq::quantize<float, signed char, float, true, 1>`` -> ``quantize f32>s8 zp channel``."""
    kernel, _, args = expr.removeprefix("gpuq::").partition("<")
    a = [x.strip() for x in args.rstrip(">").split(",")] if args else []
    if kernel in ("quantize", "dequantize"):
        return f"{kernel} {_SHORT[a[0]]}>{_SHORT[a[1]]} {'zp' if a[3] == 'true' else 'sym'} {_MAPS[a[4]]}"
    flags = {"true": "warp", "false": "block"}
    return " ".join([kernel] + [_SHORT.get(x, flags.get(x, x)) for x in a])


def occupancy(regs: int, smem: int) -> int:
    """Resident 256-thread blocks per SM (registers allocated per warp in units of 256)."""
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = SM["regs"] // per_warp // (THREADS // 32)
    by_smem = SM["smem"] // smem if smem else SM["blocks"]
    return min(by_regs, by_smem, SM["threads"] // THREADS, SM["blocks"])


# --- SASS -------------------------------------------------------------------------------

_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")


def sass_functions(text: str) -> dict:
    """``{mangled name: {"ins": [(address, predicate, opcode, operands)], "labels": {label: address}}}``
    from ``nvdisasm -c`` (which, unlike ``cuobjdump -sass``, prints labels and callee names)."""
    funcs, cur, pending = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\s*\.section\s+\.text\.(\S+?),", line)
        if m:
            cur, pending = funcs.setdefault(m.group(1), {"ins": [], "labels": {}}), []
            continue
        m = _LABEL.match(line)
        if cur is not None and m:
            pending.append(m.group(1))
            continue
        m = _INS.search(line)
        if cur is not None and m:
            ins = (int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4))
            cur["labels"].update((label, ins[0]) for label in pending)
            pending = []
            cur["ins"].append(ins)
    return funcs


def _width(op: str) -> str:
    for tag, w in ((".128", "128"), (".64", "64"), ("16", "16"), ("8", "8")):
        if tag in op.split(".", 1)[-1]:
            return w
    return "32"


def memory_summary(ins) -> dict:
    """Static counts of the global (LDG/STG, generic LD/ST, RED/ATOM) memory instructions by
    width, of the local ones (LDL/STL), and the CALL.REL targets."""
    kinds = {"ld": ("LDG", "LD."), "st": ("STG", "ST.", "RED", "ATOM"), "lcl": ("LDL", "STL")}
    out = {k: collections.Counter() for k in kinds}
    calls = set()
    for _, _, op, operands in ins:
        for k, prefixes in kinds.items():
            if op.startswith(prefixes):
                key = op[:3] if k == "lcl" else (op.split(".")[0] + ":" + _width(op))
                out[k][key] += 1
        if op.startswith("CALL"):
            m = re.search(r"\(\$?(?:__internal_\d+_\$)?(?:__cuda_)?(?:sm\d+x?_)?([\w$]+)\)", operands)
            calls.add(m.group(1) if m else operands.strip())
    fmt = lambda c: " ".join(f"{k}x{n}" for k, n in sorted(c.items())) or "-"
    return {"ld": fmt(out["ld"]), "st": fmt(out["st"]), "lcl": fmt(out["lcl"]),
            "calls": ",".join(sorted(calls)) or "-", "size": len(ins)}


def steady_path(fn, reload: bool = False) -> int:
    """SASS instructions issued by one steady-state unit of the grid-stride loop (see the docstring).

    Walks from the loop head (the target of the widest backward branch) to that branch.
    Conditional branches fall through, except: ``@P BRA P`` (both sides vectorised) and a
    branch over a short block holding a call (float-division slow path) or over a block
    holding a 64-bit division call (32-bit divmod path) are taken, as are the skip of a
    short scale reload (unless ``reload``: the scale changes at every element) and the
    no-carry branch of the strided map's odometer.
    """
    ins, labels = fn["ins"], fn["labels"]
    at = {a: i for i, (a, *_) in enumerate(ins)}

    def target(x):
        m = re.search(r"\.L_x_\d+", x[3])
        return labels[m.group()] if m else None

    back = max((x for x in ins if x[2] == "BRA" and target(x) is not None and target(x) < x[0]),
               key=lambda x: x[0] - target(x))
    i, n = at[target(back)], 0
    while n < 100000:
        a, pred, op, operands = ins[i]
        n += 1
        if ins[i] is back:
            return n
        if op == "EXIT":
            raise RuntimeError("left the loop")
        if op == "BRA":
            to = target(ins[i])
            region = [x for x in ins[i + 1:] if x[0] < to] if to > a else []
            calls = [x[3] for x in region if x[2].startswith("CALL")]
            if not pred:
                taken = True
            elif re.match(r"\s*!?U?P\d", operands):
                taken = True  # @P0 BRA P1: float and code sides both vectorised
            elif len(region) <= 40 and any(re.search(r"_(div|rem)_[su]64", c) for c in calls):
                taken = True  # skip the 64-bit division routine: 32-bit path
            elif calls and len(region) <= 8:
                taken = True  # skip the float-division slow path
            elif (not calls and len(region) <= 20 and not any(x[2] == "BRA" for x in region)
                  and any(x[2].startswith("LDG") and ".128" not in x[2] for x in region)):
                taken = not reload  # skip the scale (and zero point) reload
            elif ins[i - 1][2].startswith("ISETP.GE") and ins[i - 1][2].endswith(".EX") \
                    and ins[i + 1][2].startswith("LDL"):
                taken = True  # StridedMap::next: ++coord[d] < dims[d], no carry
            else:
                taken = False
            if taken:
                i = at[to]
                continue
        i += 1
    raise RuntimeError("no end")


# --- compile and collect ----------------------------------------------------------------

def collect(nvrtc, cuobjdump: str, nvdisasm: str, arch: str, tmp: Path, reload: bool = False) -> list:
    rows = []
    for source in registry.SOURCES:
        res = nvrtc_check.compile_source(nvrtc, source, arch, extra=("-Xptxas=-v",))
        if res.rc != 0:
            raise RuntimeError(res.describe())
        ptxas = {}
        for fn, props, used in re.findall(
                r"Function properties for (\S+)\n(.*?)\n.*?Used (\d+) registers", res.log, re.DOTALL):
            stack, st, ld = map(int, re.findall(r"(\d+) bytes", props)[:3])
            ptxas[fn] = {"regs": int(used), "stack": stack, "spill_st": st, "spill_ld": ld}
        cubin = tmp / f"{source}.{arch}.cubin"
        cubin.write_bytes(res.code)
        def run(*tool, cubin=cubin):
            return subprocess.run([*tool, str(cubin)], check=True, capture_output=True, text=True).stdout
        usage = dict(re.findall(r"Function (\S+):\n\s*(REG:.*)", run(cuobjdump, "-res-usage")))
        sass = sass_functions(run(nvdisasm, "-c"))
        for expr, mangled in res.lowered.items():
            u = dict(re.findall(r"([A-Z]+(?:\[\d\])?):(\d+)", usage[mangled]))
            fn = sass[mangled]
            try:
                elementwise = re.search(r"quantize(_(fp8|int4|fp4|fp6))?<", expr) is not None
                per_elem = f"{steady_path(fn, reload) / 16:.1f}" if elementwise else ""
            except (RuntimeError, KeyError, ValueError, TypeError):
                per_elem = "?"
            p = ptxas[mangled]
            rows.append(dict(name=short_name(expr), expr=expr, mangled=mangled, **p,
                             smem=int(u["SHARED"]), cmem=int(u["CONSTANT[0]"]),
                             blocks=occupancy(p["regs"], int(u["SHARED"])), per_elem=per_elem,
                             **memory_summary(fn["ins"]), sass=fn))
    return rows


RESOURCES = [("regs", "regs"), ("stack", "stack B"), ("spill_st", "spill st B"), ("spill_ld", "spill ld B"),
             ("smem", "smem B"), ("cmem", "cmem[0] B"), ("blocks", "blocks/SM"), ("occ", "occupancy")]
SASS = [("ld", "global loads (op:bits x static count)"), ("st", "global stores, reductions"),
        ("lcl", "local ld/st"), ("calls", "CALL.REL targets"), ("size", "SASS instr"),
        ("per_elem", "~instr/elem")]


def compress(names) -> list:
    """Names of one row as few patterns: ``quantize {f16,f32}>s8 sym tensor``."""
    split = [n.replace(">", " > ").split() for n in names]
    out, todo = [], [[t for t in split if len(t) == k] for k in dict.fromkeys(map(len, split))]
    while todo:
        group = todo.pop(0)
        values = [sorted(set(col), key=[t[i] for t in group].index) for i, col in enumerate(zip(*group))]
        if len(group) == 1 or len(group) == math.prod(len(v) for v in values):
            out.append(" ".join(v[0] if len(v) == 1 else "{" + ",".join(v) + "}" for v in values))
            continue
        i = next(i for i, v in enumerate(values) if len(v) > 1)  # split on the first varying word
        todo += [[t for t in group if t[i] == v] for v in values[i]]
    return [o.replace(" > ", ">") for o in out]


def table(rows, columns) -> str:
    groups = collections.OrderedDict()
    for r in rows:
        groups.setdefault(tuple(r[k] for k, _ in columns), []).append(r["name"])
    lines = ["| kernels | " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * (len(columns) + 1)]
    for key, names in groups.items():
        lines.append(f"| {'<br>'.join(compress(names))} | " + " | ".join(str(v) for v in key) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90", help="SASS target (default sm_90)")
    ap.add_argument("--sass", metavar="TEXT",
                    help="also print the SASS of the kernels whose name expression contains TEXT")
    ap.add_argument("--reload", action="store_true",
                    help="~instr/elem of the path that reloads the scale at every element")
    args = ap.parse_args(argv)
    global SM
    SM = LIMITS.get(args.arch, LIMITS["sm_90"])
    lib, cuobjdump, nvdisasm = nvrtc_check.find_libnvrtc(), find_tool("cuobjdump"), find_tool("nvdisasm")
    tools = {"libnvrtc (nvidia-cuda-nvrtc)": lib, "cuobjdump (nvidia-cuda-cuobjdump)": cuobjdump,
             "nvdisasm (nvidia-cuda-nvdisasm)": nvdisasm}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        print("kernel_resources: not run, missing " + " and ".join(missing) +
              ". Install them in a scratch venv: see the docstring of bench/kernel_resources.py.")
        return 0
    nvrtc = nvrtc_check.Nvrtc(lib)
    with tempfile.TemporaryDirectory() as tmp:
        rows = collect(nvrtc, cuobjdump, nvdisasm, args.arch, Path(tmp), args.reload)
    print(f"NVRTC {'.'.join(map(str, nvrtc.version()))} ({lib}), {cuobjdump}, {nvdisasm}, {args.arch}, "
          f"options {' '.join(registry.OPTIONS)}, {THREADS} threads/block\n")
    for r in rows:
        r["occ"] = f"{r['blocks'] * THREADS * 100 / SM['threads']:g}%"
    print("Resources and occupancy at 256 threads per block:\n")
    print(table(rows, RESOURCES))
    print("\nSASS (static counts; ~instr/elem: the steady-state path of a full 16-element unit"
          " divided by 16, see --help):\n")
    print(table(rows, SASS))
    if args.sass:
        for r in rows:
            if args.sass in r["expr"]:
                print(f"\n// {r['expr']}  ({r['mangled']})")
                for a, pred, op, operands in r["sass"]["ins"]:
                    print(f"/*{a:04x}*/ {pred:6s} {op}{operands};")
    return 0


if __name__ == "__main__":
    sys.exit(main())
