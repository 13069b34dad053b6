# Session 19, device call 1: the refusal's GPU test, then localise session 18's compiled FP8
# faults with the refusal lifted (forced_trace.py): aot_eager for both recipes, then inductor
# with one quantized kernel traced at a time (blockwise: weight gradients off by 103 % in s18).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 -m pytest -p no:cacheprovider -q -m gpu tests/quant/test_compile.py > $OUT/test.log 2>&1; echo "gpu test rc=$?"; tail -3 $OUT/test.log
s=benchmarks/results/session19/forced_trace.py
for r in blockwise current; do
  CHECK_BACKEND=aot_eager timeout 90 python3 $s compile $r 256 > $OUT/aot_$r.log 2>&1; echo "aot_eager $r rc=$?"; grep "^T=" $OUT/aot_$r.log
  grep -m1 -E "^[A-Za-z.]*Error|Assertion" $OUT/aot_$r.log | cut -c1-200
done
for k in grouped_gemm_scaled_wgrad quantize grouped_gemm_scaled grouped_gemm_scaled_act grouped_gemm_scaled_dgrad_gated gated_quantize_fwd amax tensor_scales; do
  [ $((SECONDS - S)) -gt 480 ] && break
  TRACE_ONLY=$k timeout 60 python3 $s compile blockwise 256 > $OUT/only_$k.log 2>&1; echo "inductor blockwise only $k rc=$?"; grep "^T=" $OUT/only_$k.log
  grep -m1 -E "^[A-Za-z.]*Error|Assertion" $OUT/only_$k.log | cut -c1-200
done
