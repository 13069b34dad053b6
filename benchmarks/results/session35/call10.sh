# Session 35, call 10: call 9's gaps again with the GPU-side record_function ranges left out (they
# counted as GPU work there) and the median step's launches in order with the host's phases.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for m in moe layer; do
  timeout 100 python3 -m benchmarks.step_gaps --model $m --shape qwen3 --T 1024 --out $OUT/gaps_qwen3_$m.json 2>&1 | grep -v "Warning\|_warn_once" | tail -45 | cut -c1-200
done
timeout 100 python3 -m benchmarks.step_gaps --model moe --shape olmoe --T 1024 --skewed --out $OUT/gaps_olmoe_s_moe.json 2>&1 | grep -v "Warning\|_warn_once" | tail -45 | cut -c1-200
timeout 60 python3 -m benchmarks.step_gaps --model dense --cell swiglu:1024:1024 --out $OUT/gaps_dense_swiglu.json > $OUT/gaps_dense.log 2>&1; head -3 $OUT/gaps_dense.log | cut -c1-200
echo "gaps ($((SECONDS - S)) s)"
