# Session 26, device call 9: the MoE routing's calls (permute / unpermute, forward and backward)
# through graph states: the MoE GPU tests, the layer at T=1024 and the MoE part of the sizes table at T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/moe --tb=short > $OUT/moe_tests.log 2>&1
echo "moe tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/moe_tests.log | cut -c1-250 | head -20; tail -1 $OUT/moe_tests.log; S=$SECONDS
timeout 100 python3 benchmarks/results/session26/moe_small.py 1024 2>&1 | grep -v "Warn\|gc.get_objects\|return Variable\|^  warn\|measuring, captures 0"
echo "moe_small ($((SECONDS - S)) s)"; S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part moe --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_moe1024 > $OUT/sizes_moe1024.log 2>&1
echo "sizes moe T=1024 rc=$? ($((SECONDS - S)) s)"; tail -8 $OUT/sizes_moe1024.log | cut -c1-220
