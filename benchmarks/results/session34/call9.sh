# Session 34, call 9 (the budget's last ~2 minutes): the quantized layer at Mixtral (8 groups) with the grouped
# per-tensor casts' new tiling (h and dz; the composition's x_sorted and dy_sorted too), against session 33's
# 18.33 ms a micro-batch of eight (1.71x bf16) and 23.60 with one (1.31x).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 100 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" --rounds 2 --out $OUT/fp8_moe_mixtral.json > $OUT/fp8_moe_mixtral.log 2>&1
echo "fp8_moe mixtral rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_mixtral.log | cut -c1-120
