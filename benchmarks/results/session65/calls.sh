#!/usr/bin/env bash
# Session 65's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
#   calls 1-3 ran session 64's: compile_gpu, guards_ab (twice: its first copy lacked pyproject.toml)
# Prepared for session 66 (one call a line; chain them within 30 s of each other):
#   SIDE_LIMIT=300 bash benchmarks/results/session65/calls.sh norm_gpu     # ~6 min: the norm change on CUDA, A/B
#   bash benchmarks/results/session65/calls.sh compiled_probe             # ~5 min: compiled vs eager kernels
#   bash benchmarks/results/session65/calls.sh dense_small                # <= 9 min: T=1024 H=1024 / 2048, 3 rounds
#   LIMIT=540 bash benchmarks/results/session64/calls.sh gpu:quantops     # 28 % (37 tests) in 290 s, session 64
#   bash benchmarks/results/session65/calls.sh autocast                   # float32 weights under autocast, T=1024
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session65 exec bash benchmarks/results/session55/calls.sh "$@"
