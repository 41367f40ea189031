#!/usr/bin/env bash
# The GPU checks of one device session, one step per device call (each well inside its
# 10-minute limit), writing what bench/results/ keeps: device, date, commit, pytest's
# summary line, the benchmark JSON/PNG/table.
#
#   GPUQ_COMMIT=<sha> bash bench/gpu_session.sh tests|torch|quick|large|rest|formats|bf16|issue38|issue40 [OUTDIR]
#
# issue38 (written, never run): bench/gpu_issue38.py, issue 38's conformance, headline rows and
# ncu on two kernels, at most 3 minutes, right after bench/gpu_check.sh in the same window.
#
# issue40 (written, never run): the checkpoint command with --device cuda on the ~3 GB bf16 Llama
# folder (made on the machine's disk with NumPy first, ~1 min), compressed-tensors int4 g128, fp8 per
# channel, NVFP4 and MXFP4, 2 runs each against a warm copy: issue 40's >= 2 GB/s of input from the
# page cache. At most ~4 minutes; bench/checkpoint.py refuses to judge the target without a real GPU.
#
# formats (issue 19; written, never run): fp8 e4m3fn and int4/uint4 g128 on torch CUDA tensors,
# gpuq against torch eager / torch.compile / torchao (bench/gpu_formats.py), 16M and 256M.
#
# OUTDIR defaults to $OUT (the device tool's folder that comes back), else bench/results.
# The tree the device tool sends has no .git: GPUQ_COMMIT names the commit it was sent from.
set -uo pipefail
# bf16 (issue 16 section 4; written, never run): torch bfloat16 input, per-tensor / per-row /
# group 128, gpuq against torch eager and torch.compile (bench/gpu_bf16.py), 16M and 64M.
step=${1:?"step: tests, torch, quick, large, rest, formats, bf16, issue38 or issue40"}
out=${2:-${OUT:-bench/results}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
date=$(date -u +%Y-%m-%dT%H%M%SZ)
case $step in
  tests)
    log="$out/gpu_tests_${date}.txt"
    printf 'device: %s\ndate: %s\ncommit: %s\n' "${gpu:-no GPU seen}" "$date" "${GPUQ_COMMIT:-unknown}" >"$log"
    python3 -m pytest -q -p no:cacheprovider -rs 2>&1 | tee "$out/pytest.log" | tail -n 1 | sed 's/^/pytest: /' >>"$log"
    cat "$log" ;;
  torch) python3 bench/gpu_torch_checks.py 2>&1 | tee "$out/gpu_torch_checks_${date}.txt" ;;  # real torch tensors: streams, graphs, grads
  quick) python3 -m bench --quick --out "$out" ;;  # seconds: every GPU contender once
  large) python3 -m bench --sizes 256M --no-latency --out "$out" ;;  # the >= 64M targets
  rest) python3 -m bench --sizes 1M,16M --out "$out" ;;  # the smaller sizes and the latency cases
  formats) python3 -m bench.gpu_formats --quick --out "$out" --no-plot \
             && python3 -m bench.gpu_formats --sizes 16M,256M --out "$out" ;;  # issue 19 (never run yet)
  bf16) python3 -m bench.gpu_bf16 --quick --out "$out" \
          && python3 -m bench.gpu_bf16 --out "$out" ;;  # issue 16 section 4 (never run yet)
  issue38) python3 bench/gpu_issue38.py --out "$out" ;;  # right after gpu_check.sh: <= 3 min (never run yet)
  issue40) python3 bench/checkpoint.py --device cuda --scheme int4 --scheme fp8 --scheme nvfp4 --scheme mxfp4 \
             --reps 2 --top 12 --dir /tmp/gpuq-bench-llama --json "$out/checkpoint_cuda_${date}.json" \
             2>&1 | tee "$out/checkpoint_cuda_${date}.txt" ;;  # issue 40's --device cuda figure (never run yet)
  *) echo "unknown step '$step': tests, torch, quick, large, rest, formats, bf16, issue38 or issue40" >&2; exit 2 ;;
esac
