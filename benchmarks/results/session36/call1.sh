# Session 36, call 1 (prepared in session 35): where the host is when the GPU waits, call by call.
# Session 35's call 10 found the GPU idle before the forward's first launch (0.2-0.3 ms, profiled)
# and between the loss's seed gradient and the backward's first launch (0.28 ms expert_layer,
# 0.40-0.45 ms composition and dense stack): step_gaps now names each call of the routing's,
# the plans' and expert_layer's autograd Functions, routing_graphs.call and GraphedProgram.run on
# the host's timeline (--mark), so the listing shows which call the host was in. ~2 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for m in moe layer; do
  timeout 100 python3 -m benchmarks.step_gaps --model $m --shape qwen3 --T 1024 --out $OUT/gaps_qwen3_$m.json 2>&1 | grep -v "Warning\|_warn_once" | tail -60 | cut -c1-200
done
timeout 60 python3 -m benchmarks.step_gaps --model dense --cell swiglu:1024:1024 --out $OUT/gaps_dense_swiglu.json 2>&1 | grep -v "Warning\|_warn_once" | tail -60 | cut -c1-200
timeout 60 python3 -m benchmarks.step_gaps --model dense --torch --cell swiglu:1024:1024 --out $OUT/gaps_dense_swiglu_torch.json 2>&1 | grep -v "Warning\|_warn_once" | head -6 | cut -c1-200
echo "gaps ($((SECONDS - S)) s)"
