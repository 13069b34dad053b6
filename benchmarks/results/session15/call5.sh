# Session 15, device call 5: the offload host-cost cuts (GPU tests, host time by function),
# issue 22's new CUDA tests and the torch.nn autocast row, where the MoE layer's 2.4-5.7 ms of
# host time a step goes (issue 20), the FP8 casts at Qwen3's shapes (issue 24).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/offload tests/test_torch_nn_behaviour.py \
  > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-220; tail -1 $OUT/tests.log
timeout 60 python3 -m benchmarks.autocast --models dense --rounds 2 --out $OUT/autocast_dense.json > $OUT/autocast_dense.log 2>&1; echo "autocast rc=$?"
timeout 60 python3 -m benchmarks.host_profile --parts moe --count-ops --top 60 > $OUT/host_profile_moe.log 2>&1; echo "host_profile rc=$?"
timeout 100 python3 -m benchmarks.offload_host --cuda --breakdown --steps 10 --stacks mlp,moe > $OUT/offload_host.log 2>&1; echo "offload_host rc=$?"
timeout 80 python3 -m benchmarks.moe_quantize > $OUT/moe_quantize.log 2>&1; echo "moe_quantize rc=$?"
tail -4 $OUT/autocast_dense.log | cut -c1-140
grep "====" $OUT/host_profile_moe.log | cut -c1-300
grep -E "^ +(mlp|moe) " $OUT/offload_host.log
tail -15 $OUT/moe_quantize.log | cut -c1-140
