# Session 40, call 8: a compiled fuseops step against an eager one, kernel by kernel (compiled_kernels.py), at three
# cells where call 7 had the compiled step slower than the eager one. ~3 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 400 python3 benchmarks/results/session40/compiled_kernels.py > $OUT/compiled_kernels.log 2>&1
echo "compiled kernels rc=$? ($((SECONDS - S)) s)"; cut -c1-200 $OUT/compiled_kernels.log | grep -v "^$" | tail -95
