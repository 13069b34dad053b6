#!/usr/bin/env bash
# Session 64's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
#   (call 1 ran session 63's: SIDE_LIMIT=300 LIMIT=240 bash benchmarks/results/session63/calls.sh refs_gpu "gpu:edge:..."
# Prepared for session 65 (one call a line; chain them within 30 s of each other):
#   SIDE_LIMIT=400 bash benchmarks/results/session64/calls.sh compile_gpu   # settings_key, GELU refs: torch 2.11
#   bash benchmarks/results/session64/calls.sh guards_ab                   # ~9 min: compiled dense H=1024, A/B
#   LIMIT=540 bash benchmarks/results/session64/calls.sh gpu:quantops     # 28 % (37 tests) in 290 s in run 5
#   LIMIT=300 bash benchmarks/results/session64/calls.sh "gpu:edge:GELU or GeGLU or BackwardLinearBiasActivation"
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session64 exec bash benchmarks/results/session55/calls.sh "$@"
