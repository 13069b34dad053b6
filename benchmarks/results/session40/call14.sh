# Session 40, call 14: the host time of a drained GPU-bound dense step, by runtime call (drained_host.py): call 7 had
# fuseops' above torch eager's on seven GPU-bound cells with no device frees. ~2 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 300 python3 benchmarks/results/session40/drained_host.py > $OUT/drained_host.log 2>&1
echo "drained host rc=$? ($((SECONDS - S)) s)"; grep -E "^==|Self CPU time total|cuda[A-Z]|Sync|Memcpy|^ *[a-z_:]+ " $OUT/drained_host.log | cut -c1-150 | head -90
