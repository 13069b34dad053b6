#!/usr/bin/env bash
# Session 66's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
#   call 1: session65/calls.sh norm_gpu (its A/B did not apply the old module: norm_ab here); call 2: norm_ab
#   compiled_probe; calls 3-4: norm_ab; 5: norm_quantize_ab; 6: norm_ab2; 7: DENSE_LIMIT=480 dense_small;
#   8: LIMIT=220 "gpu:edge:LayerNorm or RMSNorm or ForwardNormQuantizeLinear" autocast; 9: nq_gpu (README.md here)
# Prepared for session 67 (one call a line; chain them within 30 s of each other):
#   bash benchmarks/results/session66/calls.sh large_rows_gpu             # FIRST: the norms' large rows on CUDA (~3 min)
#   LIMIT=540 bash benchmarks/results/session64/calls.sh gpu:quantops    # 28 % (37 tests) in 290 s, session 64
#   bash benchmarks/results/session66/calls.sh dense_small                # the host-bound cells again (noisy)
#   LIMIT=300 bash benchmarks/results/session66/calls.sh gpu:kernels      # the kernels' GPU tests (norm caps)
#   bash benchmarks/results/session66/calls.sh compiled_timeline          # ~5 min: GPU idle gaps, eager / compiled
export PYTHONPATH=. PYTHONUNBUFFERED=1
[[ -z ${PARTS_DIR:-} ]] && export PARTS_DIR=benchmarks/results/session66
for part in "$@"; do
  if [[ -f benchmarks/results/session66/$part.sh ]]; then PARTS_DIR=benchmarks/results/session66 bash benchmarks/results/session55/calls.sh "$part"
  else PARTS_DIR=benchmarks/results/session65 bash benchmarks/results/session55/calls.sh "$part"; fi
done
