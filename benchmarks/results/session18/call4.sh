# Session 18, device call 4: do side-stream D2H / H2D copies slow the compute they overlap
# (no offload logic: plain copies of the bytes "auto" moves, issued at the forward's start)?
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/session18/copy_interference.py 2>&1 | tee $OUT/copy_interference.log | tail -4
