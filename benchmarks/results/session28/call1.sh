# Session 28, device call 1: the new autocast routing-graph GPU tests (float32 parameters under
# torch.autocast, composition and expert_layer); where the compiled MoE step's host time goes
# (Qwen3 T=1024, 10 custom ops); issue 24's kernel breakdown at Qwen3 (bf16 against FP8 current,
# weights unchanged: the cache hits, as with 8 micro-batches) and its table.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/moe/test_routing_graphs.py -k autocast > $OUT/autocast_tests.log 2>&1
echo "autocast tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/autocast_tests.log | cut -c1-250 | head -12; tail -1 $OUT/autocast_tests.log; S=$SECONDS
timeout 120 python3 benchmarks/results/session27/host_cprofile.py qwen3 1024 30 compiled > $OUT/host_compiled.log 2>&1
echo "host_cprofile compiled rc=$? ($((SECONDS - S)) s)"; grep -E "enqueue|phases" $OUT/host_compiled.log; S=$SECONDS
timeout 150 python3 -m benchmarks.moe_profile --shape qwen3-30b-a3b --impls fuseops "fuseops fp8" --warmup-s 5 --top 40 > $OUT/moe_profile.log 2>&1
echo "moe_profile rc=$? ($((SECONDS - S)) s)"; grep -E "wall" $OUT/moe_profile.log; S=$SECONDS
timeout 200 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$? ($((SECONDS - S)) s)"
grep -E "micro-batch" $OUT/fp8_moe.log | cut -c1-110
