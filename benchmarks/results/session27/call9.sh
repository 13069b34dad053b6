# Session 27, device call 9: expert_layer's forward and backward through routing graph states (one CUDA
# graph each per layer where host-bound): the MoE GPU tests, then the MoE sizes at T=1024 and 4096 with
# expert_layer beside the composition.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 190 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=short tests/moe > $OUT/moe_tests.log 2>&1
echo "moe tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/moe_tests.log | cut -c1-250 | head -12; tail -1 $OUT/moe_tests.log; S=$SECONDS
timeout 330 python3 -m benchmarks.sizes --part moe --T 1024 4096 --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"
grep -A14 "^cell" $OUT/sizes_moe.log | cut -c1-250
