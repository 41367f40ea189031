#!/usr/bin/env bash
# The device check: one command, one shot, inside a 15-minute GPU window (issue 25).
#
#   GPUQ_COMMIT=<sha> bash bench/gpu_check.sh            # on the GPU machine, under a 360 s limit
#
# Works against a hard deadline (GPUQ_CHECK_DEADLINE seconds, default 300); each step has its
# own budget, cut to what is left, and its own `timeout`. Everything streams into $OUT (else
# build/gpu_check) as it happens, so a step killed at its limit loses nothing before it.
# Files (at most 8; bench/NOTES.md "The device check" says what each holds):
#   check.log  preflight.txt  compile.json  conformance.txt  tests.txt  torch_checks.txt  bench.json
#   sanitize.txt
# On a machine without a GPU it stops after the preflight, within seconds: "no GPU: <why>", exit 1.
# Issue 38's step follows in the same window, as its own call (<= 3 min): bash bench/gpu_session.sh issue38
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=. GPUQ_REQUIRE_GPU=1
start=$(date +%s)
deadline=$((start + ${GPUQ_CHECK_DEADLINE:-300}))
log="$out/check.log"
status=0
printf 'gpuq device check\ndate: %s\ncommit: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${GPUQ_COMMIT:-unknown}" >"$log"

# step NAME BUDGET FILE CMD...: run CMD under min(BUDGET, time left) seconds, output to FILE.
step() {
  local name=$1 budget=$2 file=$3; shift 3
  local left=$((deadline - $(date +%s)))
  local limit=$((budget < left ? budget : left))
  if ((limit < 5)); then
    echo "step $name: skipped (deadline; ${left}s left)" | tee -a "$log"
    return 0
  fi
  local t0=$(date +%s)
  timeout -k 3 "$limit" "$@" >>"$file" 2>&1
  local rc=$?
  local note=""
  ((rc == 124 || rc == 137)) && note=" (killed at its ${limit}s limit)"
  echo "step $name: rc $rc in $(($(date +%s) - t0))s$note -> $(basename "$file")" | tee -a "$log"
  ((rc != 0)) && status=1
  return $rc
}

py=python3
step preflight 25 "$out/preflight.txt" $py bench/gpu_check.py preflight
if (($? != 0)); then
  tail -n 1 "$out/preflight.txt" | tee -a "$log"
  exit 1
fi
grep -m1 '^nvidia-smi' "$out/preflight.txt" >>"$log"

step compile 45 "$out/check.log" $py bench/gpu_check.py compile --json "$out/compile.json"

# The hardware conversions (issue 38) against the software paths they replace, all 2**32 float32s;
# the exact division from a reciprocal against div.rn (a quarter of the 2**46 significand pairs,
# ~15 s estimated, and every float32 at four scales). A rerun with --division-log2-s 0 checks all pairs.
# The helpers' device port and FastDivmod run in issue 38's step (bench/gpu_issue38.py), not here.
step conformance 50 "$out/conformance.txt" $py bench/gpu_conformance.py --skip-ports

# The CUDA tests on real CuPy: the sweep first, then every file's cuda parameters.
targs=(-q -rfE -p no:cacheprovider -o addopts= -o console_output_style=classic)
$py -c 'import xdist' 2>/dev/null && targs+=(-n 8)
$py -c 'import pytest_timeout' 2>/dev/null && targs+=(--timeout 60)
tests=$(ls tests/test_*.py | grep -v -e cudasim -e test_cuda_sweep -e test_kernels_compile)
step sweep 40 "$out/tests.txt" $py -m pytest "${targs[@]}" tests/test_cuda_sweep.py
step cuda-tests 90 "$out/tests.txt" $py -m pytest "${targs[@]}" -k "cuda or interop" $tests

step torch 90 "$out/torch_checks.txt" $py bench/gpu_torch_checks.py
left=$((deadline - $(date +%s)))
((left > 90)) && left=90
step bench 90 "$out/check.log" $py bench/gpu_headline.py --json "$out/bench.json" --deadline $((left - 10))

if command -v compute-sanitizer >/dev/null; then
  step racecheck 30 "$out/sanitize.txt" compute-sanitizer --tool racecheck --error-exitcode 9 $py bench/gpu_check.py sanitize
  step memcheck 30 "$out/sanitize.txt" compute-sanitizer --tool memcheck --error-exitcode 9 $py bench/gpu_check.py sanitize
fi
grep -h -E '^(=+ )?[0-9]+ (passed|failed)|passed|failed' "$out/tests.txt" | tail -n 2 | sed 's/^/pytest: /' >>"$log"
echo "done in $(($(date +%s) - start))s, status $status" | tee -a "$log"
exit $status
