# Session 19, device call 3 (issue 24): the blockwise forward/dgrad kernel's STAGES and GROUP_M
# at the Mixtral shapes, then the quantize tile sweep with session 18's register caps.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 240 python3 benchmarks/results/session19/blockwise_sweep.py 2>&1 | grep -v Warn
timeout 300 python3 -m benchmarks.quantize --tune --quantize-only --budget 150 --out $OUT > $OUT/quantize_tune.log 2>&1; echo "tune rc=$?"
tail -30 $OUT/quantize_tune.log | cut -c1-200
