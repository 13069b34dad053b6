# Session 41, call 8: the suite part `models` (tests/fusions, tests/integrations, tests/offload but the property
# suite), cut at 330 s (not timed as a whole yet; pytest -v shows how far it got).
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=330 bash benchmarks/run_gpu.sh models 2>&1 | tail -6
grep -c PASSED $OUT/models.log; grep -E "FAILED|ERROR" $OUT/models.log | head; tail -2 $OUT/models.log | cut -c1-200
