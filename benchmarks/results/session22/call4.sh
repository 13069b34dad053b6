# Session 22, device call 4: the norm backward without FMA contraction (call 3: the product-with-reciprocal
# row mean was as fast as before session 21 but LayerNorm(1) float32 was again ~4e-5 off: offline PTX showed
# the contraction of "- mean(wdy)" into an FMA with the unrounded dy * w); GPU norm tests, LayerNorm /
# RMSNorm CUDA edge cases, the A/B against 4e353b6. Then where a replayed step's host time goes: the
# recorded programs and a cProfile (call 3: dense GELU T=1024 enqueue 4.41 -> 4.58 ms, SwiGLU 3.68 -> 3.09).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/elementwise -k "norm" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -5
LIMIT=120 bash benchmarks/run_gpu.sh edge "LayerNorm or RMSNorm"
for r in build/norm_base . build/norm_base .; do
  FUSEOPS_ROOT=$r timeout 60 python3 benchmarks/results/session22/norm_ab.py 2>&1 | grep -E "bwd" | grep -E "16384x4096|16384x1024|4096x1024"
done
echo "norm ($((SECONDS - S)) s)"
timeout 240 python3 benchmarks/results/session22/replay_profile.py --steps 200 > $OUT/replay_profile.log 2>&1
echo "profile rc=$? ($((SECONDS - S)) s)"
grep -E "^== |replays in" $OUT/replay_profile.log | head -20
