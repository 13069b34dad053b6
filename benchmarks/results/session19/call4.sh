# Session 19, device call 4: compiled fuseops against torch.compile at small sizes (host, guards,
# kernels); the blockwise forward/dgrad ring depth again (STAGES 4 vs 3, repeated; fc2 dgrad added).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/results/session19/compiled_gap.py 1024,1024 4096,1024 2>&1 | grep -v "Warn\|warn"
timeout 200 python3 benchmarks/results/session19/blockwise_sweep.py 4,8 3,8 4,8 3,8 2>&1 | grep -v Warn
