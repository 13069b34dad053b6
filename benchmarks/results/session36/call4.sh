# Session 36, call 4: call 3's profiles drained the GPU before each step; fp8_moe times steps back
# to back. The same steps back to back (--no-drain): the GPU's idle is then the host's alone; with
# the host's slow CUDA calls (syncs, allocations) and Python's garbage collections named. Plus the
# drained x8 step once more (call 3: a 4.4 ms host gap between the first micro-batch's forward and
# backward).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
run() { timeout 120 python3 -m benchmarks.step_gaps --model fp8 --warmup 6 --steps 3 --top 10 --mark --gc "$@" 2>&1 | grep -v "Warning\|_warn_once" | grep -v "^  *[0-9.]* *[0-9.]* *[0-9]*  [a-z(]" | head -30 | cut -c1-300; }
run --fp8-shape qwen3-30b-a3b --impl layer --micro-batches 8 --no-drain --out $OUT/nodrain_qwen3_layer_8.json
run --fp8-shape qwen3-30b-a3b --impl bf16 --micro-batches 8 --no-drain --out $OUT/nodrain_qwen3_bf16_8.json
run --fp8-shape qwen3-30b-a3b --impl layer --micro-batches 1 --no-drain --out $OUT/nodrain_qwen3_layer_1.json
run --fp8-shape qwen3-30b-a3b --impl bf16 --micro-batches 1 --no-drain --out $OUT/nodrain_qwen3_bf16_1.json
run --fp8-shape qwen3-30b-a3b --impl layer --micro-batches 8 --out $OUT/drain_qwen3_layer_8.json
echo "gaps ($((SECONDS - S)) s)"
