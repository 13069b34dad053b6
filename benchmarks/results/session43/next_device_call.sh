# Prepared in session 43 for the next device session's first call (~9 min): (a) where the compiled dense step's
# host time goes before its first launch, against eager, at a host-bound and a GPU-bound cell
# (compiled_host_parts.py; closing note 43, Next 1); (b) more rounds of compiled_idle.py at one GPU-bound cell
# (Next 2); (c) the `kernels` GPU part, not run since session 41, as far as the time goes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 150 python3 benchmarks/results/session43/compiled_host_parts.py --cells gelu:1024:1024 gelu:16384:4096 \
  > $OUT/compiled_host_parts.log 2>&1
echo "compiled_host_parts rc=$? ($((SECONDS - S)) s)"; grep -v -i warn $OUT/compiled_host_parts.log | tail -24
S=$SECONDS
timeout 120 python3 benchmarks/results/session43/compiled_idle.py --cells gelu:16384:4096 --rounds 4 \
  > $OUT/compiled_idle.log 2>&1
echo "compiled_idle rc=$? ($((SECONDS - S)) s)"; grep -v -i warn $OUT/compiled_idle.log | grep -v "gap " | tail -4
LIMIT=$((570 - SECONDS)) bash benchmarks/run_gpu.sh kernels 2>&1 | tail -4
