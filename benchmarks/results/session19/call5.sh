# Session 19, device call 5 (issue 20): where the dense stack's eager host time goes on the H100
# host now (cProfile, 4 GELU blocks, T=1024 H=1024), fuseops beside torch.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m benchmarks.host_profile --parts dense --T 1024 --H 1024 --steps 30 --top 60 > $OUT/host_profile_dense.log 2>&1; echo "rc=$?"
grep -E "host time per step" $OUT/host_profile_dense.log
