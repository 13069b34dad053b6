# Session 14, device call 1: the offload planner's second batch (issue 23: GPU tests, the
# curve), the dense dispatch table (issue 20 item 2), the host costs (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/offload \
  > $OUT/offload_tests.log 2>&1
echo "offload tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/offload_tests.log | cut -c1-200; tail -1 $OUT/offload_tests.log
timeout 40 python3 -m benchmarks.host_costs > $OUT/host_costs.log 2>&1; echo "host_costs rc=$?"
timeout 200 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
timeout 150 python3 -m benchmarks.dense_dispatch --rows 64 1024 4096 16384 --out $OUT/dense_dispatch.json \
  > $OUT/dense_dispatch.log 2>&1; echo "dense_dispatch rc=$?"
grep -A12 "^mlp\|^attn\|^moe" $OUT/offload.log | head -40; tail -12 $OUT/host_costs.log
cat $OUT/dense_dispatch.log | cut -c1-100 | head -80
