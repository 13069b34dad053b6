# Session 49 run 1: where the MoE layer's host time goes (issue 20's 0.5 ms), then why `all` drops GPU-bound graphs.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for cell in "qwen3 4096 all" "olmoe 1024" "qwen3 1024"; do
  name=$(echo $cell | tr ' ' '_')
  timeout 120 python3 benchmarks/results/session48/moe_host_probe.py $cell > $OUT/moe_host_$name.log 2>&1
  echo "$cell rc=$?"; head -3 $OUT/moe_host_$name.log | cut -c1-250
done
for cell in gelu:4096:4096 swiglu:4096:4096; do
  echo "== $cell"
  timeout 80 python3 benchmarks/results/session48/dead_results_probe.py host $cell all > $OUT/all_drops_${cell//:/_}.log 2>&1
  echo "rc=$?"; tail -12 $OUT/all_drops_${cell//:/_}.log | cut -c1-300
done
