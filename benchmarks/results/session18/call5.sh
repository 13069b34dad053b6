# Session 18, device call 5: a profiler trace of the moe stack, none against auto: compute
# stream busy time and gaps, and which kernels take longer (issue 23).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/session18/offload_trace.py --stack moe 2>&1 | tee $OUT/offload_trace.log | tail -40
