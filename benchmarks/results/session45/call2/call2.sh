# Session 45 call 2: where a synchronised GPU-bound step's first kernel waits (step_start.py, four variants, two
# cells), then the CUDA edge cases of the elementwise subjects (session 44's prepared next_device_call.sh).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 300 python3 benchmarks/results/session45/step_start.py --cells gelu:4096:4096 gelu:16384:2048 --host \
  > $OUT/step_start.log 2>&1
echo "step_start rc=$? ($((SECONDS - S)) s)"
LIMIT=$((570 - SECONDS)) bash benchmarks/run_gpu.sh edge "GELU or SiLU or ReLU or SReLU or Sigmoid or Identity or Bias or SwiGLU or GeGLU or ReGLU" 2>&1 | tail -3
grep -v Warning $OUT/step_start.log | grep -E "==|^   [a-z]" | head -20
