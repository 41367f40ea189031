"""The ``gpuq`` command: quantize checkpoints from the shell and see what it cost.

::

    gpuq example tiny.safetensors                       # a small bfloat16 checkpoint, offline
    gpuq quantize tiny.safetensors -o tiny-int8.safetensors
    gpuq quantize IN -o OUT --group-size 128 --symmetric --exclude 'lm_head.*' --json
    gpuq quantize IN -o OUT --dtype int4 --group-size 128   # packed int4, one scale per 128 inputs
    gpuq quantize IN -o OUT --dtype float8_e4m3fn           # fp8, one scale per row
    gpuq compare IN                                         # int8 vs int4 g128 vs fp8: SQNR per tensor
    gpuq dequantize tiny-int8.safetensors -o tiny-f32.safetensors
    gpuq quantize llama/ -o llama-int8/                  # sharded: a folder or its *.index.json
    gpuq quantize llama/ -o llama-int8/ --workers 2      # its shards as tasks on a local Dask cluster
    gpuq info

Exit codes: 0 on success, 2 for bad input or usage (one ``gpuq: error: ...``
line on stderr, no output file left behind), 130 on Ctrl-C (SIGINT) and 143 on
SIGTERM (one line, what the run wrote removed: :mod:`gpuq.cli.signals`).
``python -m gpuq`` is the same command.

>>> main(["quantize"])
2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from ..qparams import METHODS
from ..checkpoints.files import CliError
from ..checkpoints.convert import DEQUANTIZE_DTYPES
from ..checkpoints.formats import FORMATS
from ..checkpoints.quantized import CODE_DTYPES
from ..checkpoints.report import format_table, to_json
from ..checkpoints.scale_rules import INT_RULES, MX_RULES, SCALE_RULES, SCALES
from ..checkpoints.selection import DEFAULT_MIN_SIZE, DEFAULTS_HELP
from .signals import EXIT_STATUS, Terminated, stop_signals, stopped_line

__all__ = ["main", "build_parser"]

_QUANTIZE_HELP = f"""\
Quantize the floating tensors of a checkpoint to int8/uint8, int4/uint4, fp8 or fp4/fp6 codes.

Selected: floating tensors (float16, bfloat16, float32, float64) of rank >= 2
with at least --min-size elements (default {DEFAULT_MIN_SIZE}), filtered by
--include/--exclude globs; everything else is copied bit for bit.

Scheme: per-channel along --axis K; --per-tensor for one scale per tensor;
--group-size G for one scale per G consecutive elements along --axis (default
-1 with a group size: the input dimension); --block AxB for one scale per AxB
block of the last two dimensions (blocks of 1 on leading dimensions, so an
expert of a rank-3 tensor never shares a block; the last blocks may be
smaller; --block=-1x128: -1 is the whole dimension). With none of them, each tensor gets the default of its code type
and rank:

{DEFAULTS_HELP}

Scales and zero points come from gpuq.choose_qparams on each tensor (min/max;
--symmetric for zero point 0). --calibrate mse searches, per block, the best of
20 shrunken ranges (p = 1.00, 0.99, ... 0.81 of min/max) by the float64 sum of
squared round-trip errors (gpuq.choose_qparams(..., method="mse"), the same
bits on every device); it matters for int4 and fp8, about 20x the min/max
time. The file holds ordinary scales either way; the report's JSON records the
method ("calibrate").

Code types (--dtype): int8 (default), uint8; int4 and uint4 (ranges [-8, 7]
and [0, 15], two codes per byte in ONNX's nibble order: the codes are a 1-D
uint8 tensor of ceil(n/2) bytes and the metadata records the shape; groups of
128 by default); float8_e4m3fn and float8_e5m2 (fp8: q = fp8(x / s),
scales max|x| / 448 or / 57344, no zero points, --symmetric implied; stored
as safetensors F8_E4M3/F8_E5M2, as uint8 bits in an .npz); float4_e2m1fn
(packed as int4), float6_e2m3fn and float6_e3m2fn (one code per byte, U8),
always saturating, gpuq's format only (file format version 5).

Scale rules. Symmetric int codes (--symmetric, or compressed-tensors'
default): --scale-rule full, max|x| / ((qmax - qmin) / 2) with codes clamped
to [qmin, qmax] (int4 / 7.5: torchao's, compressed-tensors' and GPTQ's rule,
the default for int4 and uint4 in every format), or narrow, max|x| / qmax
(int4 / 7, int8 / 127: the default for int8 and uint8, and gpuq's array
API's default). --scales mx: power-of-two scales 2**k stored as e8m0 bytes
(U8), k by --scale-rule floor, even (default), ceil or rceil; the default of
fp4/fp6 codes, over groups of 32 along the last dimension. --scales nvfp4
(float4_e2m1fn): e4m3 block scales (F8_E4M3) per 16 along the last dimension
and a float32 global scale per tensor (NAME.global_scale, [1]),
compressed-tensors' rule. The report names the rule.

Output (same format as IN; an .npz for a .npy IN, whose array is named
arr_0): for each quantized tensor NAME, the codes under NAME, float32
NAME.scales and NAME.zps (int8 for int8/int4 codes, uint8 for uint8/uint4; none
for symmetric int8/int4, zero point 0, nor for fp8), and the scheme in the gpuq
metadata (file format version 1 for int8/uint8 with one axis per tensor,
readable by older gpuq; version 2 for int4/fp8; version 3 for a file with a
multi-axis tensor, the rank >= 3 default; version 4 for block scales; version 5
for fp4/fp6 codes or MX/NVFP4 scales, whose scales are stored as e8m0 bytes or
e4m3 with NAME.global_scale). The report compares each tensor with
its float32 dequantization: SQNR = 10 log10(sum x^2 / sum (x - x_hat)^2) in
float64 (inf when exact) and the max abs error.

NaN and +-Inf (--nonfinite): counted per tensor and reported. warn (default)
and allow quantize such a tensor with scales and zero points from its finite
values (NaN -> the zero point, +Inf -> qmax, -Inf -> qmin; fp8: NaN stays NaN,
+-Inf -> +-max finite; fp4/fp6: NaN -> 0, +-Inf -> +-max; SQNR and max error
over the finite values), warn saying so on stderr; error stops with exit 2.

The output is written tensor by tensor as the input is read: peak memory is
about the largest tensor's input and output plus a fixed overhead.

Sharded checkpoints: IN may be a folder holding one *.safetensors.index.json
(Hugging Face's model-00001-of-00030.safetensors + model.safetensors.index.json)
or that index. Every shard's header is checked against the index first. OUT is
then a folder (created if missing): one output shard per input shard, same
file name, each the file a one-file run on that shard writes, plus the index
under the input's index name, its weight_map listing NAME.scales/NAME.zps
beside each code tensor. Every shard is written under a hidden name of the
run's; only when all have succeeded are they renamed into place (an earlier
run's index removed first, the new index written last). A run that fails, or
is stopped by Ctrl-C (exit 130) or SIGTERM (exit 143), removes what it wrote
and leaves OUT exactly as it was.

On a Dask cluster (needs pip install 'gpuq[dask]'): --scheduler ADDRESS or
--workers N runs one task per shard. Each task quantizes whole tensors on its
worker (its GPU under --device auto, when it has one) and writes its output
shard itself, so IN and OUT must be on a filesystem the client and every
worker see at the same paths (the local disk for --workers), and every
worker must have the same gpuq installed. --workers N starts N local worker
processes (dask-cuda's LocalCUDACluster, one worker per GPU, when dask-cuda
is installed and a GPU is visible), which never see a Ctrl-C or SIGTERM meant
for the command: it stops them itself. A task that fails is retried by Dask
(twice; a dead worker's tasks are rescheduled); the index is written by the
client once every shard has succeeded, and the result is the same bytes as a
local run. The first shard that fails stops the others at their next tensor;
the client waits for them (for --workers, closes its cluster) before it
removes the run's files.

Serving formats (--format compressed-tensors | fp8-blocks): IN and OUT are
model folders (config.json, model.safetensors or shards with their index,
other files copied) that vLLM, SGLang and transformers load. The rank-2
*.weight tensors of Linear layers are quantized (not embeddings, not norms;
lm_head only when an --include names it), with scales in the model's dtype.
compressed-tensors: int8 (default; per output channel, symmetric: W8A16),
int4 (groups of 128 by default, --group-size G, or --axis 0 per channel),
--asymmetric for zero points; float8_e4m3fn per output channel or
--per-tensor. fp8-blocks: float8_e4m3fn, one float32 weight_scale_inv per
128x128 block. Every module whose weight stays in float is listed in the
config's ignore (ignored_layers), q/k/v and gate/up are quantized together or
not at all, and the report's vLLM column says whether vLLM's kernels take
each layer's shape. The folder is written all or nothing, config.json last.
--preset NAME (llm-compressor's W8A16, W4A16, W4A16_ASYM, W8A8, INT8,
FP8_DYNAMIC, FP8_BLOCK, NVFP4A16, MXFP4A16, MXFP4, MXFP6A16, MXFP8A16, MXFP8)
writes the compressed-tensors folder llm-compressor writes for it, NVFP4 and
MX ones included (nvfp4-pack-quantized, mxfp4/mxfp6-pack-quantized,
mxfp8-quantized); NVFP4's q/k/v and gate/up share one global scale.
"""


_COMPARE_HELP = f"""\
Quantize each selected tensor of IN in memory with several schemes and print
the SQNR of each (dB, of the float32 dequantization, as gpuq quantize reports
it) side by side, with the total SQNR and the bytes each scheme would store.
Nothing is written. The selection is gpuq quantize's (floating, rank >= 2,
--min-size, --include/--exclude).

IN is a checkpoint file or a sharded one (a folder, or its *.index.json), or a
model folder with one model.safetensors (that file is read).

--scheme DTYPE[:OPTION]... (repeatable; default int8, int4, float8_e4m3fn):
DTYPE is int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn,
float6_e2m3fn or float6_e3m2fn; options gG
(groups of G, along the last axis unless axisK), axisK (per-channel; -1 with
a group size), tensor (per-tensor), bAxB (one scale per AxB block of the last
two dimensions, as quantize --block), sym (zero point 0; implied for fp8),
float32, mx or nvfp4 (the scales, as quantize --scales), full, narrow, floor,
even, ceil or rceil (the scale rule, as quantize --scale-rule).
Without gG, axisK, tensor or bAxB, a scheme is gpuq quantize's default for its
code type and each tensor's rank:

{DEFAULTS_HELP}

Examples: int8:sym, int4:sym:narrow, uint4:g64, float8_e5m2:tensor,
float8_e4m3fn:b128x128, float4_e2m1fn (MX, groups of 32), float4_e2m1fn:nvfp4,
float6_e2m3fn:mx:ceil.

--calibrate minmax (default) or mse, repeatable: with both, each scheme gets a
column per method (minmax first), so the MSE search's gain shows side by side:
gpuq compare IN --scheme int4 --calibrate minmax --calibrate mse
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as the same one line as every other gpuq error."""

    def error(self, message):
        self.exit(2, f"gpuq: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for every subcommand."""
    parser = _Parser(
        prog="gpuq", description="Quantize and dequantize checkpoints with gpuq.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    q = sub.add_parser("quantize", help="quantize a checkpoint (.safetensors, .npz, .npy)",
                       description=_QUANTIZE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("input", metavar="IN", help="input checkpoint: .safetensors, .npz or .npy, "
                                               "or a sharded one (a folder, or its *.index.json)")
    q.add_argument("-o", "--output", metavar="OUT", required=True,
                   help="output file, same format as IN (.npz for a .npy IN); a folder for a "
                        "sharded IN")
    g = q.add_mutually_exclusive_group()
    g.add_argument("--axis", type=int, metavar="K",
                   help="per-channel axis (-1 with --group-size; default: see the table above)")
    g.add_argument("--per-tensor", action="store_true", help="one scale per tensor")
    g.add_argument("--block", metavar="AxB",
                   help="one scale per AxB block of the last two dimensions (128x128: the "
                        "fine-grained fp8 layout; the last blocks may be smaller; leading "
                        "dimensions get blocks of 1)")
    q.add_argument("--group-size", type=int, metavar="G",
                   help="one scale per G elements along --axis")
    q.add_argument("--dtype", choices=CODE_DTYPES, default=None,
                   help="code type (default int8; float8_e4m3fn for --format fp8-blocks): int8, "
                        "uint8; int4, uint4 (packed two per byte); float8_e4m3fn, float8_e5m2 "
                        "(fp8, always symmetric); float4_e2m1fn (packed), float6_e2m3fn, "
                        "float6_e3m2fn (gpuq's format; MX scales by default)")
    q.add_argument("--scales", choices=SCALES, default=None,
                   help="float32 (default of int and fp8 codes); mx: power-of-two e8m0 scales (OCP "
                        "MX; default of fp4/fp6, also fp8; groups of 32 by default); nvfp4: e4m3 "
                        "scales per 16 and a float32 global scale per tensor (float4_e2m1fn)")
    q.add_argument("--scale-rule", choices=SCALE_RULES, default=None,
                   help=f"symmetric int codes: {INT_RULES[0]} (max|x| / 7.5 for 4-bit: their default) "
                        f"or {INT_RULES[1]} (max|x| / qmax: / 7, / 127; 8-bit default); --scales mx: "
                        f"{', '.join(MX_RULES)} (default even)")
    s = q.add_mutually_exclusive_group()
    s.add_argument("--symmetric", action="store_true",
                   help="scale from max |x|, zero point 0 (128 for uint8, 8 for uint4); "
                        "implied for fp8 and the default of --format compressed-tensors")
    s.add_argument("--asymmetric", action="store_true",
                   help="min/max scale and a zero point: the default of gpuq's format; "
                        "with --format compressed-tensors, zero points for int8/int4")
    q.add_argument("--format", choices=tuple(FORMATS), default="gpuq",
                   help="gpuq (default: IN's format, gpuq's metadata); compressed-tensors or "
                        "fp8-blocks: a model folder (config.json + safetensors) that vLLM, "
                        "SGLang and transformers load (see 'Serving formats' above); "
                        "gpt-oss-mxfp4: a bf16 gpt-oss folder's experts in gpt-oss's own MXFP4")
    q.add_argument("--preset", metavar="NAME",
                   help="llm-compressor's preset: W8A16, W4A16, W4A16_ASYM, W8A8, INT8, FP8_DYNAMIC, "
                        "FP8_BLOCK, NVFP4A16, MXFP4A16, MXFP4, MXFP6A16, MXFP8A16, MXFP8: the "
                        "compressed-tensors folder llm-compressor writes for it (implies --format "
                        "compressed-tensors; no scheme flag beside it)")
    q.add_argument("--include", action="append", default=[], metavar="PATTERN",
                   help="quantize only tensors whose name matches this glob (repeatable)")
    q.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="keep tensors whose name matches this glob in float (repeatable)")
    q.add_argument("--min-size", type=int, default=DEFAULT_MIN_SIZE, metavar="N",
                   help=f"quantize tensors of at least N elements (default {DEFAULT_MIN_SIZE})")
    q.add_argument("--calibrate", choices=METHODS, default="minmax",
                   help="how scales come from the data: minmax (default, each block's range) "
                        "or mse (the best of 20 shrunken ranges by squared error)")
    q.add_argument("--nonfinite", choices=("error", "warn", "allow"), default="warn",
                   help="tensors with NaN/Inf: error stops; warn (default) and allow quantize "
                        "them from their finite values, warn saying so")
    _common(q, json_help="print the report as JSON instead of a table")
    c = q.add_mutually_exclusive_group()
    c.add_argument("--scheduler", metavar="ADDRESS",
                   help="sharded IN: run the shards as tasks on this Dask scheduler "
                        "(tcp://host:8786); IN and OUT must be on a filesystem shared by "
                        "this machine and every worker")
    c.add_argument("--workers", type=int, metavar="N",
                   help="sharded IN: run the shards on a local Dask cluster of N worker "
                        "processes")

    d = sub.add_parser("dequantize", help="restore float tensors from a gpuq-quantized file or a "
                                          "quantized model folder",
                       description="Restore float tensors from a file written by gpuq quantize; "
                                   "other tensors are copied bit for bit. A model folder (with a "
                                   "config.json) quantized as compressed-tensors (pack-quantized, "
                                   "naive/float/int-quantized), fine-grained fp8 (weight_scale_inv) "
                                   "or by gpuq gives a dense model folder in the model's dtype (or "
                                   "--dtype), quantization_config removed; an unknown "
                                   "quantization_config is one line, exit 2. Every tensor is "
                                   "checked against the file's gpuq metadata (format version, "
                                   "code, scale and zero-point dtypes and shapes) before "
                                   "anything is written. A .npz IN may be "
                                   "written to a .npy OUT when it holds a single tensor. "
                                   "A sharded IN (a folder written by gpuq quantize, or its "
                                   "*.index.json) gives a sharded OUT folder: the same shard "
                                   "names, an index without the scales and zero points, each "
                                   "shard written atomically and the index last; it runs on "
                                   "this machine (no --scheduler/--workers).")
    d.add_argument("input", metavar="IN", help="a file written by gpuq quantize, or a sharded "
                                               "folder (or its *.index.json)")
    d.add_argument("-o", "--output", metavar="OUT", required=True,
                   help="output file, same format as IN; a folder for a sharded IN")
    d.add_argument("--dtype", choices=DEQUANTIZE_DTYPES, default=None,
                   help="output float type (default: each tensor's source dtype recorded in "
                        "IN, e.g. bfloat16 in, bfloat16 back; float32 where none is recorded; "
                        "float64 multiplies in float64)")
    d.add_argument("--nonfinite", choices=("error", "warn", "allow"), default="warn",
                   help="restored tensors with NaN/Inf (fp8 NaN codes, or codes times scales beyond "
                        "the output dtype): error stops; warn (default) and allow write them, warn "
                        "saying so (one line a tensor, with the count)")
    _common(d, json_help="print the summary as JSON")

    m = sub.add_parser("compare", help="SQNR per tensor of several code types side by side "
                                        "(int8 vs int4 g128 vs fp8 by default)",
                       description=_COMPARE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("input", metavar="IN", help="a checkpoint: .safetensors, .npz or .npy, or "
                                               "a sharded one (a folder, or its *.index.json)")
    m.add_argument("--scheme", action="append", default=[], metavar="SPEC",
                   help="DTYPE[:gG][:axisK][:tensor][:bAxB][:sym][:SCALES][:RULE], repeatable "
                        "(default: int8, int4, float8_e4m3fn)")
    m.add_argument("--include", action="append", default=[], metavar="PATTERN",
                   help="compare only tensors whose name matches this glob (repeatable)")
    m.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="leave out tensors whose name matches this glob (repeatable)")
    m.add_argument("--min-size", type=int, default=DEFAULT_MIN_SIZE, metavar="N",
                   help=f"tensors of at least N elements (default {DEFAULT_MIN_SIZE})")
    m.add_argument("--calibrate", action="append", choices=METHODS, default=[], metavar="METHOD",
                   help="minmax (default) or mse, as for quantize; repeatable: --calibrate minmax "
                        "--calibrate mse gives each scheme a column per method")
    m.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to compute (as for quantize)")
    m.add_argument("--json", action="store_true", help="print the comparison as JSON")

    i = sub.add_parser("info", help="version, backend, GPU, CUDA/NVRTC, kernel compile check")
    i.add_argument("--json", action="store_true", help="print as JSON")
    i.add_argument("--no-compile-check", action="store_true",
                   help="skip compiling the kernels with NVRTC (takes a few seconds)")

    e = sub.add_parser("example", help="write a small Llama-shaped checkpoint to try gpuq on",
                       description="Write a small deterministic checkpoint (2 layers, hidden "
                                   "256, 2.1M parameters, 4 MiB in bfloat16): no download needed. "
                                   "--model-dir DIR writes it as a model folder that transformers "
                                   "loads (config.json + model.safetensors, MLP 768: 2.5M "
                                   "parameters).")
    e.add_argument("output", metavar="OUT", nargs="?",
                   help=".safetensors (default choice), .npz or .npy")
    e.add_argument("--model-dir", metavar="DIR",
                   help="write a model folder (a new or empty folder) instead of OUT")
    e.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                   help="tensor dtype (default bfloat16; .npz/.npy need float16 or float32)")
    e.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return parser


def _common(p, json_help):
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to compute: cuda needs CuPy and a GPU; auto (default) uses the "
                        "GPU when there is one")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _warn(text: str) -> None:
    print(f"gpuq: warning: {text}", file=sys.stderr)


def _show_progress(args) -> bool:
    return not args.quiet and sys.stderr.isatty()


def _quantize(args) -> int:
    from ..checkpoints.api import run_quantize

    report = run_quantize(args, warn=_warn, progress=_show_progress(args))
    print(to_json(report) if args.json else format_table(report))
    return 0


def _dequantize(args) -> int:
    from ..checkpoints.api import run_dequantize
    from ..checkpoints.report import format_dequantize

    report = run_dequantize(args, warn=_warn, progress=_show_progress(args))
    print(to_json(report) if args.json else format_dequantize(report))
    return 0


def _info(args) -> int:
    from ..checkpoints.env import info

    report = info(compile_check=not args.no_compile_check)
    if args.json:
        print(json.dumps(report))
    else:
        width = max(map(len, report))
        for key, value in report.items():
            print(f"{key.replace('_', ' '):<{width}}  {'-' if value is None else value}")
    # NVRTC is here but the kernels do not compile (or the compiler cannot run): the
    # GPU path is broken, and scripts checking an install must see it. No NVRTC at all
    # (a CPU-only install) is not an error.
    compiled = str(report.get("kernels_compile") or "")
    return 1 if compiled.startswith(("no:", "unknown")) else 0


def _example(args) -> int:
    from ..checkpoints.api import example

    if (args.output is None) == (args.model_dir is None):
        raise CliError("gpuq example takes OUT (a checkpoint file) or --model-dir DIR, one of them")
    s = example(args.output, model_dir=args.model_dir, dtype=args.dtype, seed=args.seed)
    print(f"wrote {s['path']}: {s['tensors']} tensors, {s['parameters']:,} parameters, "
          f"{s['dtype']}, {s['bytes']:,} bytes")
    return 0


def _compare(args) -> int:
    from ..checkpoints.api import compare
    from ..checkpoints.comparison import format_compare

    if args.min_size < 0:
        raise CliError(f"--min-size must be >= 0, got {args.min_size}")
    report = compare(args.input, scheme=args.scheme, include=args.include, exclude=args.exclude,
                     min_size=args.min_size, calibrate=args.calibrate, device=args.device)
    print(to_json(report) if args.json else format_compare(report))
    return 0


_COMMANDS = {"quantize": _quantize, "dequantize": _dequantize, "compare": _compare,
             "info": _info, "example": _example}


def main(argv=None) -> int:
    """Run the ``gpuq`` command with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    >>> main(["quantize", "missing.safetensors", "-o", "out.safetensors"])
    2
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed "gpuq: error: ..." (code 2) or help (0)
        return int(exc.code or 0)
    if args.version:
        from .. import __version__

        print(f"gpuq {__version__}")
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return _run(_COMMANDS[args.command], args)


def _run(command, args) -> int:
    try:
        with stop_signals():
            return command(args)
    except CliError as exc:
        print(f"gpuq: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # stdout closed early (gpuq ... | head): not an error worth a traceback.
        # Point stdout at devnull so the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        # atomic_output already removed its temporary file on the way up.
        print(stopped_line(signal.SIGINT), file=sys.stderr)
        return EXIT_STATUS[signal.SIGINT]
    except Terminated:
        print(stopped_line(signal.SIGTERM), file=sys.stderr)
        return EXIT_STATUS[signal.SIGTERM]
