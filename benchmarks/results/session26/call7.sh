# Session 26, device call 7: the SwiGLU half of the dense sizes table (final graph code: graphs'
# results handed out at capture, written inputs restored), then where the MoE layer's host time goes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 280 python3 -m benchmarks.sizes --part dense --acts swiglu --rounds 2 --reps 10 --out $OUT/sizes_dense_swiglu > $OUT/sizes_dense_swiglu.log 2>&1
echo "sizes dense swiglu rc=$? ($((SECONDS - S)) s)"; tail -11 $OUT/sizes_dense_swiglu.log | cut -c1-220; S=$SECONDS
timeout 150 python3 -m benchmarks.host_trace --part moe --top 30 > $OUT/host_trace_moe.log 2>&1
echo "host_trace moe rc=$? ($((SECONDS - S)) s)"; tail -60 $OUT/host_trace_moe.log | cut -c1-200
