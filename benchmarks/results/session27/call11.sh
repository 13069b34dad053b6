# Session 27, device call 11: gradients made contiguous inside the routed backward calls and expert_layer's
# backward graph (sum()'s one-element gradient copied in as one element): the MoE tests (GPU ones, and the
# routing-graph and expert_layer CPU tests on torch 2.11), then the MoE sizes at T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 190 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=short tests/moe > $OUT/moe_tests.log 2>&1
echo "moe gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/moe_tests.log | cut -c1-250 | head -12; tail -1 $OUT/moe_tests.log; S=$SECONDS
timeout -s INT -k 10 120 python3 -m pytest -q -p no:cacheprovider -m "not gpu" --tb=short tests/moe/test_routing_graphs.py tests/moe/test_expert_layer.py > $OUT/moe_cpu_tests.log 2>&1
echo "moe cpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/moe_cpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/moe_cpu_tests.log; S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part moe --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_moe1024 > $OUT/sizes_moe1024.log 2>&1
echo "sizes moe T=1024 rc=$? ($((SECONDS - S)) s)"
grep -A8 "^cell" $OUT/sizes_moe1024.log | cut -c1-250
