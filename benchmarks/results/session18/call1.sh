# Session 18, device call 1: the save notice (issue 23, merged CPU-tested only in session 17):
# GPU offload tests and the offload benchmark; the routing's loud-failure test and the grouped
# fusion GPU tests (launcher descriptors); the MoE sizes at T=1024 (hot path).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
run() { name=$1; lim=$2; shift 2; timeout -s INT -k 10 $lim $q "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/$name.log | cut -c1-220; tail -1 $OUT/$name.log; }
run tests_offload 120 tests/offload
timeout 280 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
run tests_routing 60 tests/moe/test_routing.py -k out_of_range_row_map_fails_loudly
run tests_grouped_fusions 100 tests/fusions/test_grouped_mlp.py tests/fusions/test_forward_quantized_grouped_mlp.py
timeout 100 python3 -m benchmarks.sizes --part moe --T 1024 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1; echo "sizes rc=$?"
tail -8 $OUT/sizes_moe.log | cut -c1-200
grep -E "^(mlp|attn|moe):|auto|none |all |ready" $OUT/offload.log | grep -v "auto profile" | cut -c1-300
