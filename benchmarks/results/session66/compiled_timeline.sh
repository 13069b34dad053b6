# Issue 20 (compiled >= torch.compile): GPU idle time and its longest gaps in eager / compiled fuseops and torch
# steps at the GPU-bound cells where compiled fuseops ran 5-12 % behind eager with the same kernels (call 2).
timeout ${PROBE_LIMIT:-400} python3 benchmarks/results/session66/compiled_timeline.py \
  --cells swiglu:16384:1024 gelu:16384:2048 --steps 5 2>&1 | grep -v "^USDT\|Warn" \
  | tee "$OUT_PART/compiled_timeline.log" | cut -c1-160
