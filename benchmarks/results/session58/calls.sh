#!/usr/bin/env bash
# Session 58's parts (the *.sh files here) beside session 55's and earlier (see session 57's calls.sh).
#   (run 7: a first version of forward_mode, then `top`)
# Prepared for session 59 (one call a line; the machine goes back 30 s after a call; chain them):
#   bash benchmarks/results/session58/calls.sh hot_path_ab         # ~6 min: this session's per-call reads, A/B
#   bash benchmarks/results/session58/calls.sh forward_mode        # ~6 min: again, with the adjoint tests (CUDA)
#   LIMIT=540 bash benchmarks/results/session58/calls.sh "gpu:edge:Backward or ForwardActivation or ForwardNorm"
#   LIMIT=540 bash benchmarks/results/session58/calls.sh "gpu:edge:ForwardQuantize or GroupedMLP or Linear"
#   LIMIT=500 bash benchmarks/results/session58/calls.sh "gpu:props:Backward"   # then other -k slices
#   then parts not run lately: gpu:ops, gpu:graphs, gpu:kernels, gpu:hopper, gpu:fp8layer, gpu:models2, gpu:quantops
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session58 exec bash benchmarks/results/session55/calls.sh "$@"
