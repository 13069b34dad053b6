# Session 23, device call 8: step wall time against CUDA-event time and the SM clock / power meanwhile,
# GELU T=16384 H=4096: fuseops eager, torch.compile, torch eager, two rounds.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/session23/clocks.py > $OUT/clocks.log 2>&1
echo "rc=$?"; grep -E "^round" $OUT/clocks.log
