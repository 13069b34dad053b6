# Session 43, call 3: ragged descriptors with tuple geometry (kept encoded maps): the descriptor test, the grouped
# GEMMs' GPU tests (every ragged-descriptor launcher), the MoE layer's A/B (tuples against lists) with the busy-host
# issue time; then the `top` part as far as the time goes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/ops/executor/test_graphed.py -k descriptor > $OUT/descriptor.log 2>&1
echo "descriptor rc=$? ($((SECONDS - S)) s)"; tail -1 $OUT/descriptor.log
S=$SECONDS
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/kernels/gemm/test_grouped.py \
  tests/kernels/gemm/test_grouped_gated.py tests/kernels/gemm/test_grouped_scaled_act.py \
  tests/kernels/gemm/test_grouped_wgrad.py tests/kernels/hopper/test_wgrad.py > $OUT/grouped_gpu.log 2>&1
echo "grouped gpu rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/grouped_gpu.log | cut -c1-200; tail -1 $OUT/grouped_gpu.log
S=$SECONDS
timeout 150 python3 benchmarks/results/session43/moe_host_ab.py --ab ragged --cells qwen3:16384 qwen3:4096 qwen3:1024 olmoe:4096 > $OUT/moe_host_ab_ragged.log 2>&1
echo "ragged A/B rc=$? ($((SECONDS - S)) s)"; grep -v -i warn $OUT/moe_host_ab_ragged.log | tail -32
LIMIT=$((560 - SECONDS)) bash benchmarks/run_gpu.sh top 2>&1 | tail -4
