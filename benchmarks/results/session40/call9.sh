# Session 40, call 9: a compiled fuseops step's use of the executor's CUDA graphs against an eager one's
# (compiled_graphs.py), at the cells where call 8 found its host time 0.5-1.4 ms above eager's. ~2 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 400 python3 benchmarks/results/session40/compiled_graphs.py > $OUT/compiled_graphs.log 2>&1
echo "compiled graphs rc=$? ($((SECONDS - S)) s)"; cut -c1-300 $OUT/compiled_graphs.log | grep -v Warn | tail -12
