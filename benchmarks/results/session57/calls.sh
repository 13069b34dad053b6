#!/usr/bin/env bash
# Prepared in session 57 for the next device session (the machine goes back 30 s after a call and counted its whole
# held time in sessions 56 and 57: put parts in a call back to back). Session 57's own parts are the *.sh files here,
# which session 55's calls.sh runs (PARTS_DIR) beside its own and earlier sessions' (and gpu:<run_gpu.sh part>).
#   bash benchmarks/results/session57/calls.sh routing_fix moe_sizes   # ~7 min: the MoE stack of the offload
#                                                                      # benchmark settles? tests/moe/test_routing_graphs.py;
#                                                                      # sizes.py's MoE T=1024/4096 cells again
#   bash benchmarks/results/session57/calls.sh routing_ab                # ~4 min: run 6's compiled MoE cells, A/B
#   LIMIT=540 bash benchmarks/results/session57/calls.sh gpu:moe        # tests/moe (last run in session 55)
#   LIMIT=300 bash benchmarks/results/session57/calls.sh gpu:edge       # not run lately; use -k slices if it is cut
# The props part needs -k slices (session 57: ForwardQuantizedGroupedMLP alone ran past 5 minutes):
#   LIMIT=500 bash benchmarks/run_gpu.sh props "Backward"
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session57 exec bash benchmarks/results/session55/calls.sh "$@"
