# Issue 20 (compiled >= torch.compile): the device kernels of an eager and a compiled fuseops step, summed by name,
# at the GPU-bound cells where compiled fuseops ran 5-12 % behind eager fuseops (run 4), and one host-bound cell.
timeout ${PROBE_LIMIT:-400} python3 benchmarks/results/session65/compiled_kernels.py \
  --cells swiglu:16384:1024 gelu:16384:1024 gelu:16384:2048 swiglu:1024:1024 --steps 10 2>&1 | grep -v "^USDT\|Warn" \
  | tee "$OUT_PART/compiled_kernels.log" | cut -c1-160
