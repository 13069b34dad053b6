# Session 22, device call 2: recorded plan runs (issue 20, new: fuseops/ops/executor/replay.py) on the
# GPU: a bitwise check against the full path and the step / enqueue A/B (dense stacks, MoE layers);
# the norm kernels' row-mean A/B again (call 1: rmsnorm bwd 16384x4096 1.84x -> 1.44x, one sample);
# then the CUDA edge cases of the dense fusions (NaN, Inf, zero rows, second shape: replay on).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 300 python3 benchmarks/results/session22/replay_ab.py --reps 20 --rounds 3 > $OUT/replay_ab.log 2>&1
echo "replay_ab rc=$? ($((SECONDS - S)) s)"; cat $OUT/replay_ab.log | tail -22 | cut -c1-200
for r in build/norm_base . build/norm_base .; do
  FUSEOPS_ROOT=$r timeout 60 python3 benchmarks/results/session22/norm_ab.py 2>&1 | grep -E "rms bwd|ln bwd" | grep -E "16384x4096|16384x1024"
done
echo "norm A/B ($((SECONDS - S)) s)"
LIMIT=$((590 - (SECONDS - S))) bash benchmarks/run_gpu.sh edge "ForwardLinearBiasAct or ForwardLinearAdd or BackwardActBias or Sequential or Linear"
