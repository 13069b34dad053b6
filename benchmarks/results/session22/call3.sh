# Session 22, device call 3: the step / enqueue A/B of recorded plan runs (call 2's script failed after its
# bitwise check: the torch twin was left on the CPU); the norm kernels' row mean, now one correctly rounded
# reciprocal per program and an FMA correction (offline ptxas, sm_90a: HEAD's per-row div_rn spilled 508
# bytes in the one-block rms backward against 48 before it; this version 72), A/B against 4e353b6 and the
# GPU norm tests and LayerNorm / RMSNorm CUDA edge cases.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for r in build/norm_base . build/norm_base .; do
  FUSEOPS_ROOT=$r timeout 60 python3 benchmarks/results/session22/norm_ab.py 2>&1 | grep -E "16384x4096|16384x1024|4096x1024"
done
echo "norm A/B ($((SECONDS - S)) s)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/elementwise -k "norm" 2>&1 | tail -2
LIMIT=120 bash benchmarks/run_gpu.sh edge "LayerNorm or RMSNorm"
echo "tests ($((SECONDS - S)) s)"
timeout $((580 - (SECONDS - S))) python3 benchmarks/results/session22/replay_ab.py --reps 20 --rounds 3 > $OUT/replay_ab.log 2>&1
echo "replay_ab rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/replay_ab.log | grep -v "return torch" | tail -20 | cut -c1-200
