# Session 26, device call 8: the MoE part of the sizes table (every shape, T and routing; the grouped
# backward now graphed), then CUDA edge cases of quantized fusions not yet run on torch 2.11.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 250 python3 -m benchmarks.sizes --part moe --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; tail -20 $OUT/sizes_moe.log | cut -c1-220; S=$SECONDS
OUT=$OUT LIMIT=$((570 - SECONDS)) bash benchmarks/run_gpu.sh edge "ForwardActivationQuantizeLinear and not zero_rows"
