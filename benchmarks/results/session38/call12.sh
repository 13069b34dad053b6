# Session 38, call 12 (H100): fp8_moe's update now alternates its direction (the weights stayed finite only
# ~20 steps before: calls 9-11 found FP8 current at Mixtral with eight micro-batches at 35 ms with
# --rep 2500 against 19.5 at the default, and the weights infinite then NaN). (a) the probe: every step's time
# and the weights finite; (b) Mixtral FP8 current alone at --rep 2500; (c) issue 24's table, both shapes, both
# FP8 recipes, default repetitions. ~5 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 100 python3 benchmarks/results/session38/drift_probe.py 2>&1 | grep -v Warn | awk 'NR % 8 == 2 || /gc|finite/' | cut -c1-100
echo "probe ($((SECONDS - S)) s)"; S=$SECONDS
timeout 120 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" --cadences 8 --rounds 2 --rep 2500 > $OUT/rep2500.log 2>&1
echo "rep 2500 rc=$? ($((SECONDS - S)) s)"; grep micro-batch $OUT/rep2500.log | cut -c1-150; S=$SECONDS
timeout 300 python3 -m benchmarks.fp8_moe --recipes "fp8 current" "fp8 blockwise" --rounds 3 --out $OUT/fp8_moe_h100.json > $OUT/fp8_moe_h100.log 2>&1
echo "fp8_moe rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_h100.log | cut -c1-150
