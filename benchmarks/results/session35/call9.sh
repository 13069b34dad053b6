# Session 35, call 9: where the GPU waits in issue 20's MoE cells at T=1024 (benchmarks.step_gaps,
# new: idle gaps between a step's kernels, and which were the host's), the composition, the
# layer and torch at Qwen3, the composition at OLMoE skewed (1.06x in call 2), the dense SwiGLU
# T=1024 H=1024 cell; then issue 24's Qwen3 FP8 layer kernel breakdown after call 4's tiling.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for m in moe layer torch; do
  timeout 100 python3 -m benchmarks.step_gaps --model $m --shape qwen3 --T 1024 --out $OUT/gaps_qwen3_$m.json 2>&1 | grep -v Warning | tail -14 | cut -c1-230
done
timeout 100 python3 -m benchmarks.step_gaps --model moe --shape olmoe --T 1024 --skewed --out $OUT/gaps_olmoe_s_moe.json 2>&1 | tail -14 | cut -c1-230
timeout 60 python3 -m benchmarks.step_gaps --model dense --cell swiglu:1024:1024 --out $OUT/gaps_dense_swiglu.json 2>&1 | tail -14 | cut -c1-230
echo "gaps ($((SECONDS - S)) s)"; S=$SECONDS
timeout 150 python3 -m benchmarks.moe_profile --shape qwen3-30b-a3b --impls "fuseops fp8 layer" --steps 3 --warmup-s 5 --top 22 > $OUT/moe_profile_fp8.log 2>&1
echo "moe_profile rc=$? ($((SECONDS - S)) s)"; tail -30 $OUT/moe_profile_fp8.log | cut -c1-160
