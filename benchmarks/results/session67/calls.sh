#!/usr/bin/env bash
# Session 67's parts (the *.sh files here), run through session 55's calls.sh (a tar of each part's logs in $OUT).
#   call 1: session66/calls.sh large_rows_gpu; 2: session66/calls.sh compiled_timeline; 3: LIMIT=540
#   session64/calls.sh gpu:quantops; 4: LIMIT=300 session66/calls.sh gpu:kernels; 5: inductor_kernels.py (four
#   cells); 6: kernels_rest; 7: large_rows_gpu (with the near-maximum rows) gelu_small. README.md here.
export PYTHONPATH=. PYTHONUNBUFFERED=1
for part in "$@"; do
  if [[ -f benchmarks/results/session67/$part.sh ]]; then PARTS_DIR=benchmarks/results/session67 bash benchmarks/results/session55/calls.sh "$part"
  else bash benchmarks/results/session66/calls.sh "$part"; fi
done
