# Session 53, device call 5: the top-level tests after the compiled Sequential's records change (torch 2.11), then
# the dense cells still short of a target: H=2048 T=1024 (host-bound: 1.2x; compiled against torch.compile) and
# SwiGLU H=4096 T=16384 (host against torch eager's, session 51: 5.09 / 4.85 ms).
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=230 OUT=$OUT bash benchmarks/run_gpu.sh top | tail -3
timeout 130 python3 -m benchmarks.sizes --part dense --H 2048 --T 1024 --rounds 3 --out $OUT/dense_h2048 \
  > $OUT/dense_h2048.log 2>&1; echo "sizes rc=$?"
tail -5 $OUT/dense_h2048.log | cut -c1-250
timeout 170 python3 -m benchmarks.sizes --part dense --acts swiglu --H 4096 --T 16384 --rounds 2 \
  --out $OUT/swiglu_h4096_t16384 > $OUT/swiglu_h4096_t16384.log 2>&1; echo "sizes rc=$?"
tail -4 $OUT/swiglu_h4096_t16384.log | cut -c1-250
