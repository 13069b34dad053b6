#!/usr/bin/env bash
# Prepared in session 56 for the next device session (the machine goes back 30 s after a call, and a one-chip
# machine counted its whole held time in session 56: put two or three parts in a call). Session 56's own parts are
# the *.sh files here, which session 55's calls.sh runs (PARTS_DIR) beside its own (its parts, session 54's and 52's, and
# gpu:<run_gpu.sh part>). Each part tars its logs into $OUT/<part>.tar.
#   bash benchmarks/results/session56/calls.sh settle offload      # ~6 min: the GPU no-sync offload test with the
#                                                                   # final graph_settle_steps, then issue 23's
#                                                                   # benchmark with every point settled
#   bash benchmarks/results/session56/calls.sh moe_sizes dense_small  # ~10 min: sizes.py's T=1024/4096 MoE cells and
#                                                                   # T=1024 dense cells with each variant settled
#                                                                   # before it is timed (session 54's parts)
#   LIMIT=540 bash benchmarks/results/session56/calls.sh gpu:kernels  # not run lately
#   LIMIT=540 bash benchmarks/results/session56/calls.sh gpu:models   # not run lately
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session56 exec bash benchmarks/results/session55/calls.sh "$@"
