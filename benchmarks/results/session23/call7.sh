# Session 23, device call 7 (the last): idle GPU time inside the GELU T=16384 H=4096 step (call 6: fuseops
# 81.4 ms a step against 77.2 ms of kernels; torch.compile 78.3 against 76.7): the largest gaps between
# kernels and the host's waiting CUDA calls, fuseops eager, torch.compile, torch eager.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 benchmarks/results/session23/gaps.py > $OUT/gaps.log 2>&1
echo "gaps rc=$? ($((SECONDS - S)) s)"; grep -E "^(==|  )" $OUT/gaps.log | cut -c1-170
