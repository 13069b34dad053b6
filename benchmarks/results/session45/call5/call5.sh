# Session 45 call 5: the GPU time a step spends per kernel at the GPU-bound dense cell still under 1.0x (GELU
# T=4096 H=4096: fuseops eager 0.982x in session 44's call 2), fuseops eager against torch eager / compiled;
# then the `ops` part (tests/moe, tests/ops) as far as the call goes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 150 python3 benchmarks/results/session45/kernel_sums.py --cells gelu:4096:4096 > $OUT/kernel_sums.log 2>&1
echo "kernel_sums rc=$? ($((SECONDS - S)) s)"
LIMIT=$((575 - SECONDS)) bash benchmarks/run_gpu.sh ops 2>&1 | tail -3
grep -v Warn $OUT/kernel_sums.log | grep -A14 -E "^(==|   [a-z_]+ \(last)" | head -60
