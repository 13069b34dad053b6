# Session 50 run 6: peak memory and issue time, today's rule against every program graphed, a fresh process each.
export PYTHONPATH=. PYTHONUNBUFFERED=1
for cell in moec:qwen3:1024 moec:qwen3:4096:s moec:olmoe:16384 moe:qwen3:4096 gelu:1024:1024 gelu:16384:2048 swiglu:4096:1024; do
  for v in today all_shared; do
    timeout 90 python3 benchmarks/results/session50/mem_ab.py $v $cell 2>&1 | grep -v "^cell" | grep -E "^(moe|gelu|swiglu)" | cut -c1-170
  done
done
