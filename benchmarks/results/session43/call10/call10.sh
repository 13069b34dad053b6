# Session 43, call 10: the CUDA edge cases of the grouped subject (zero rows, one row, non-finite, dtype max,
# non-contiguous) after the ragged descriptors' tuple geometry and the MoE eager replays.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=220 bash benchmarks/run_gpu.sh edge "GroupedLinear" 2>&1 | tail -5
