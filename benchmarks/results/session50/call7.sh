# Session 50 run 7: the new default (GPU-bound programs graphed where their graphs copy <= 1 % of their inputs'
# bytes) against the rule before (FUSEOPS_CUDA_GRAPHS=host) and `all`: the graphs GPU tests, then shared_pool's
# issue time and peak memory, one fresh process per variant and cell.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=200 bash benchmarks/run_gpu.sh graphs
for cell in moec:olmoe:16384 moec:qwen3:1024 gelu:4096:4096 swiglu:4096:4096 gelu:16384:2048 moe:qwen3:4096; do
  for mode in host 1 all; do
    v=today; [ $mode = all ] && v=all_shared
    echo "$mode $(FUSEOPS_CUDA_GRAPHS=$mode timeout 100 python3 benchmarks/results/session50/mem_ab.py $v $cell 2>&1 \
      | grep -E "^(moe|gelu|swiglu)" | cut -c1-175)"
  done
done
