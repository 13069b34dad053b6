# Session 41, call 1: the drained step's runtime calls at GPU-bound dense cells (drained_calls.py; issue 20's host
# target), then the autocast check owed since session 40's graph-decision change. ~5 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 200 python3 benchmarks/results/session41/drained_calls.py > $OUT/drained_calls.log 2>&1
echo "drained calls rc=$? ($((SECONDS - S)) s)"; grep -v -i warn $OUT/drained_calls.log | grep -v "^ *return\|^ *_warn" | cut -c1-240 | tail -70; S=$SECONDS
timeout 200 python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1
echo "autocast rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/autocast.log | cut -c1-200
