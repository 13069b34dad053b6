# Third call: the hot path where users start, after session 32's change (expert_layer's wrapper and fallback
# check, the routing of the quantized layer, the quantize / amax kernels' new specializations). The MoE cells
# at the small and medium token counts, eager and compiled, against torch eager and torch.compile; float32
# weights under torch.autocast (expert MLP and dense); the GPU tests of the top level (compile, CUDA graphs).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 240 python3 -m benchmarks.sizes --part moe --T 1024 4096 --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A14 "^cell" $OUT/sizes_moe.log | cut -c1-330; S=$SECONDS
timeout 150 python3 -m benchmarks.autocast --T 1024 --rounds 2 --out $OUT/autocast.json > $OUT/autocast.log 2>&1
echo "autocast rc=$? ($((SECONDS - S)) s)"; tail -8 $OUT/autocast.log | cut -c1-200; S=$SECONDS
LIMIT=150 bash benchmarks/run_gpu.sh top -m gpu
echo "top gpu tests ($((SECONDS - S)) s)"
