# Session 37, call 3 (prepared in session 37, no device time left then): issue 24's layer with the
# weight gradients into float32 main_grad (fp8_moe --main-grad, new: accumulate_into_main_grad, which
# expert_layer now serves; the wgrad kernels add to the buffers, so no accumulation kernel runs, where
# the plain .grad path spent ~1.0 ms a micro-batch of eight on adds at Qwen3 in session 36), both FP8
# recipes at Qwen3; and the blockwise GEMMs alone at Qwen3 (the 1.2x target's gap; --library-only times
# the library's route, on sm_90 the Gluon blockwise kernels, whatever Triton tile its row names); then the sizes MoE cells. ~9 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" "fp8 blockwise" --main-grad \
  --rounds 3 --out $OUT/fp8_moe_main_grad.json > $OUT/fp8_moe_main_grad.log 2>&1
echo "fp8_moe main_grad rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_main_grad.log | cut -c1-120; S=$SECONDS
timeout 100 python3 -m benchmarks.fp8_gemm_tiles --recipe "fp8 blockwise" --library-only --out $OUT/blockwise_tiles_qwen3.json \
  > $OUT/blockwise_tiles_qwen3.log 2>&1
echo "blockwise tiles rc=$? ($((SECONDS - S)) s)"; tail -12 $OUT/blockwise_tiles_qwen3.log | cut -c1-160; S=$SECONDS
# The rules' owed check of the hot path (expert_layer's backward takes main_grad; compiled Sequentials' backward
# operator is side-effecting): the MoE cells at the small and medium token counts, eager and compiled (Qwen3,
# OLMoE; session 35's call 2 ran this in ~3 min). Last: it may be cut by the call's limit.
timeout 220 python3 -m benchmarks.sizes --part moe --T 1024 4096 --shapes qwen3 olmoe --rounds 2 --reps 10 \
  --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A10 "^cell" $OUT/sizes_moe.log | cut -c1-330
