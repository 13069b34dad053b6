# Prepared in session 50 for the next device session: the new default (GPU-bound programs graphed where their graphs
# copy <= 1 % of their inputs' bytes, graphed.GPU_BOUND_COPIES) across the sizes tables. One call each; every part
# writes its output under $OUT as it goes (session 50's run 7 lost its output piped into `tail`).
#   bash benchmarks/results/session50/next_device_calls.sh tests      # ~5 min: graphs part, compile GPU tests
#   bash benchmarks/results/session50/next_device_calls.sh dense_small # ~5 min: dense H=1024 / 2048, every T
#   bash benchmarks/results/session50/next_device_calls.sh dense_large # ~5 min: dense H=4096, every T
#   bash benchmarks/results/session50/next_device_calls.sh moe         # ~4 min: MoE Qwen3 / OLMoE T=1024 / 4096
#   bash benchmarks/results/session50/next_device_calls.sh moe_large   # Qwen3 / OLMoE T=16384
#   bash benchmarks/results/session50/next_device_calls.sh mixtral     # Mixtral, every T (issue 20's table complete)
#   bash benchmarks/results/session50/next_device_calls.sh memory      # ~5 min: host / 1 / all, fresh processes
#   bash benchmarks/results/session50/next_device_calls.sh autocast    # ~2 min
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
sizes() {  # name, then sizes.py arguments
  local name=$1; shift
  timeout 540 python3 -m benchmarks.sizes --rounds 2 "$@" --out $OUT/$name > $OUT/$name.log 2>&1; echo "$name rc=$?"
  grep -E "^cell|^(gelu|swiglu|qwen3|olmoe|mixtral) |CUDA-graph" $OUT/$name.log | cut -c1-200
}
case "${1:-}" in
  tests)
    LIMIT=240 bash benchmarks/run_gpu.sh graphs
    timeout 200 python3 -m pytest -p no:cacheprovider -q -m gpu tests/test_compile.py > $OUT/compile.log 2>&1
    echo "compile rc=$?"; tail -2 $OUT/compile.log ;;
  dense_small) sizes sizes_dense_small --part dense --H 1024 2048 --rounds 3 ;;
  dense_large) sizes sizes_dense_large --part dense --H 4096 ;;
  moe) sizes sizes_moe --part moe --shapes qwen3 olmoe --T 1024 4096 ;;
  moe_large) sizes sizes_moe_large --part moe --shapes qwen3 olmoe --T 16384 ;;
  mixtral) sizes sizes_mixtral --part moe --shapes mixtral ;;
  memory)
    for cell in swiglu:4096:4096 gelu:16384:4096 moec:qwen3:4096:s moe:olmoe:16384; do
      for mode in host 1 all torch; do  # (torch: the torch.nn model, dense cells only)
        v=today; [ $mode = all ] && v=all_shared; [ $mode = torch ] && v=torch
        echo "$mode $(FUSEOPS_CUDA_GRAPHS=${mode/torch/1} timeout 60 python3 benchmarks/results/session50/mem_ab.py $v $cell 2>&1 \
          | grep -E "^(moe|gelu|swiglu)" | cut -c1-300)" | tee -a $OUT/memory.txt
      done
    done ;;
  autocast)
    timeout 150 python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1; echo "autocast rc=$?"
    tail -5 $OUT/autocast.log | cut -c1-200 ;;
  *) echo "usage: $0 tests|dense_small|dense_large|moe|moe_large|mixtral|memory|autocast" ;;
esac
