# Session 27, device call 10: where expert_layer's host time goes (call 9: enqueue 0.84 ms at Qwen3 T=1024 with
# its forward and backward each one graph): phases of a step, then cProfile.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 100 python3 benchmarks/results/session27/host_cprofile.py qwen3 1024 50 layer > $OUT/cprofile_layer.log 2>&1
echo "rc=$? ($((SECONDS - S)) s)"; grep "enqueue\|phases" $OUT/cprofile_layer.log | cut -c1-300
grep -A40 "Ordered by: internal" $OUT/cprofile_layer.log | cut -c1-150
