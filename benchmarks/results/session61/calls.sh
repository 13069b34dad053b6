#!/usr/bin/env bash
# Session 61's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
# Run in session 61: run 2 session 60's `dispatch_gpu`; run 3 `gpu:props:ForwardLinearAddExtraInput or
# ForwardLinearBiasActivation`; run 4 `gpu:kernels`; run 5 `float32`; run 6 `float32_tf32`; `fp32_tiles` prepared, not run (no device time left).
# Prepared for session 62 (one call a line; chain them within 30 s):
#   TILES_LIMIT=300 SWEEP_S=260 bash benchmarks/results/session61/calls.sh fp32_tiles   # float32 grouped GEMM tiles,
#                                                   # ieee and tf32 (fuseops 1.4-7x slower than a torch.mm loop, run 6)
#   bash benchmarks/results/session61/calls.sh second_backward hot_path_ab   # ~9 min: create_graph tests on CUDA; A/B
#   LIMIT=540 bash benchmarks/results/session58/calls.sh gpu:kernels   # again: every GEMM kernel has F32_DOT since run 4
#   LIMIT=540 bash benchmarks/results/session58/calls.sh gpu:hopper "gpu:props:ForwardLinearBiasActivation"
#   then session 59's list: gpu:edge slices (ForwardQuantize*), gpu:models2, gpu:quantops (540 s)
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session61 exec bash benchmarks/results/session55/calls.sh "$@"
