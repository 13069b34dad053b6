# Session 41, call 2: cProfile of drained dense steps (session 39's drained_profile.py) at a GPU-bound cell, where
# fuseops' recorded programs replay without graphs (call 1: issue 3.23 ms against torch eager's 2.81, runtime calls
# ~0.45 ms of it), and at a host-bound one where every program is graphed (1.79 against 1.78). ~3 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for cell in gelu:16384:4096 gelu:1024:1024; do
  S=$SECONDS
  timeout 200 python3 benchmarks/results/session39/drained_profile.py --cell $cell --top 45 > $OUT/drained_profile_${cell//:/_}.log 2>&1
  echo "$cell rc=$? ($((SECONDS - S)) s)"; grep "^====\|function calls" $OUT/drained_profile_${cell//:/_}.log
done
