# Session 24, device call 13: issue 20's whole sizes table with CUDA graphs of recorded programs on
# (default): dense GELU / SwiGLU x T {1024, 4096, 16384} x H {1024, 2048, 4096}, then the MoE cells.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 385 python3 -m benchmarks.sizes --part dense --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "dense rc=$? ($((SECONDS - S)) s)"; tail -20 $OUT/sizes_dense.log
timeout $((575 - (SECONDS - S))) python3 -m benchmarks.sizes --part moe --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "moe rc=$? ($((SECONDS - S)) s)"; tail -20 $OUT/sizes_moe.log
