#!/usr/bin/env bash
# The session's last device call: the fused-MLP GPU tests, then the benchmarks the issues
# name, each under its own time limit. Everything lands in $OUT/results.tar.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=dev
out=${OUT:-/tmp/fuseops-gpu}; mkdir -p "$out"
timeout 110 python3 -m pytest -q -x --tb=short -p no:cacheprovider -m gpu \
  tests/kernels/test_grouped_gemm_gated.py tests/fusions/test_grouped_mlp.py > "$out/gated_tests.log" 2>&1
tail -25 "$out/gated_tests.log"
run() { local t=$1; shift; echo "== $*"; timeout "$t" python3 "$@" > "$out/$(basename "$1" .py).log" 2>&1; echo "rc=$?"; tail -14 "$out/$(basename "$1" .py).log"; }
run 110 benchmarks/linear.py --no-compile
run 200 benchmarks/moe_layer.py --rounds 1 --rep 60
run 80 benchmarks/offload.py
run 80 benchmarks/quantize.py
tar -cf "$out/results.tar" benchmarks/results "$out"/*.log 2>/dev/null
