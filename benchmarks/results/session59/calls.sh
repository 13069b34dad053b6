#!/usr/bin/env bash
# Session 59's parts (the *.sh files here) beside session 58's and 55's (session 55's calls.sh runs them).
# Run in session 59: runs 1-5 session 58's calls.sh (hot_path_ab, forward_mode, gpu:edge slice, gpu:graphs, gpu:ops),
# run 6 `batched` (a first version), run 7 `gpu:quantops` (partial). Prepared for session 60 (one call a line; chain
# them within 30 s):
#   LIMIT=420 bash benchmarks/results/session59/calls.sh batched     # ~7 min: this session's tests on torch 2.11 (GPU)
#   bash benchmarks/results/session59/calls.sh hot_path_ab           # ~6 min: the per-call reads and guards, A/B
#   LIMIT=540 bash benchmarks/results/session58/calls.sh "gpu:edge:ForwardQuantize or GroupedMLP or Linear"
#   then gpu:props:<slice>, gpu:kernels, gpu:hopper, gpu:fp8layer, gpu:models2, gpu:quantops (37 passed in 340 s in
#   run 7: compile-bound; give it 540 s)
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session59 exec bash benchmarks/results/session55/calls.sh "$@"
