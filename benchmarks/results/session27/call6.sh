# Session 27, device call 6: the MoE layer's host time by Python function (cProfile), Qwen3 and OLMoE T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
for s in qwen3 olmoe; do
  S=$SECONDS
  timeout 120 python3 benchmarks/results/session27/host_cprofile.py $s 1024 50 > $OUT/cprofile_$s.log 2>&1
  echo "$s rc=$? ($((SECONDS - S)) s)"; grep "enqueue" $OUT/cprofile_$s.log | cut -c1-300
done
grep -A52 "Ordered by: internal" $OUT/cprofile_qwen3.log | cut -c1-160
