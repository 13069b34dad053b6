# Session 39, call 4: where a compiled step's host time goes (issue 20: fuseops compiled 2.65 ms against its eager
# 1.95 at the dense GELU cell T=4096 H=1024, enqueue 2.11 against 1.09; call 2), dense and the MoE composition,
# eager beside compiled; then issue 24's table at both shapes, both FP8 recipes (no stagger). ~6 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 150 python3 -m benchmarks.host_profile --compiled --parts dense --T 4096 --H 1024 --top 45 > $OUT/host_profile_dense.log 2>&1
echo "dense profile rc=$? ($((SECONDS - S)) s)"; grep "====" $OUT/host_profile_dense.log; S=$SECONDS
timeout 150 python3 -m benchmarks.host_profile --compiled --parts moe --T 1024 --top 45 > $OUT/host_profile_moe.log 2>&1
echo "moe profile rc=$? ($((SECONDS - S)) s)"; grep "====" $OUT/host_profile_moe.log; S=$SECONDS
timeout 240 python3 -m benchmarks.fp8_moe --recipes "fp8 current" "fp8 blockwise" --rounds 3 --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1
echo "fp8_moe rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe.log | cut -c1-100
