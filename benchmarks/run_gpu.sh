#!/usr/bin/env bash
# One device call: `tests` runs the suite on CUDA (gpu-marked tests included),
# `bench NAME...` runs benchmarks. Logs and results go under $OUT (or /tmp/fuseops-gpu).
# Usage on the GPU machine, from a checkout:  bash benchmarks/run_gpu.sh tests
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
out=${OUT:-/tmp/fuseops-gpu}
mkdir -p "$out"
mode=${1:-tests}
shift || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
case "$mode" in
  tests)
    python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$out/tests.log" | tail -40
    ;;
  bench)
    # Benchmarks write JSON/PNG to benchmarks/results/; one tarball comes back (the
    # device returns at most 8 files).
    for name in "$@"; do
      echo "== $name"
      python3 "benchmarks/$name.py" > "$out/$name.log" 2>&1
      tail -15 "$out/$name.log"
    done
    tar -cf "$out/results.tar" benchmarks/results "$out"/*.log 2>/dev/null
    ;;
esac
