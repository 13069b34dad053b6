# Session 40, call 16: the CUDA-graph decision by the shortest enqueue time, with at most MEASURED_CALLS timed runs
# outstanding (call 15: a host ahead of the GPU waited in its launches, and by the median GPU-bound programs were
# captured from step 60 on). (a) The gpu-marked graph tests; (b) issue 20's dense table, every cell (call 7 before
# the change, another machine start); (c) the MoE cells at T=1024 / 4096 (call 13 before). ~9 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=110 bash benchmarks/run_gpu.sh graphs 2>&1 | tail -3
S=$SECONDS
timeout 300 python3 -m benchmarks.sizes --part dense --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A20 "^cell" $OUT/sizes_dense.log | cut -c1-250
S=$SECONDS
timeout 120 python3 -m benchmarks.sizes --part moe --T 1024 4096 --shapes qwen3 olmoe --rounds 2 --reps 10 \
  --out $OUT/sizes_moe_small > $OUT/sizes_moe_small.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A9 "^cell" $OUT/sizes_moe_small.log | cut -c1-250
