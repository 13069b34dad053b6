# Session 22, device call 7 (the last): issue 23's three stacks with the final tree (plan runs now replay
# where no save receiver listens: "none" replays, offloaded forwards take the full path, their backwards
# replay), then the CUDA property suite of three dense fusions (with the replayed-call check).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 230 python3 -m benchmarks.offload --steps 6 --rounds 5 --out $OUT/offload3 > $OUT/offload3.log 2>&1
echo "3 stacks rc=$? ($((SECONDS - S)) s)"
grep -E "^(mlp|attn|moe):|\* auto|^ +none|^ +all|against none" $OUT/offload3.log | cut -c1-200
LIMIT=$((470 - (SECONDS - S))) bash benchmarks/run_gpu.sh props "ForwardLinearBiasAct or BackwardActBias or ForwardLinearAdd"
