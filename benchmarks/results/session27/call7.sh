# Session 27, device call 7: run_gpu.sh top (tests/quant but test_quantize.py, the top-level tests; last run in
# session 20), every test there, gpu-marked or not, on the device's torch 2.11.
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=$OUT LIMIT=570 bash benchmarks/run_gpu.sh top
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/top.log | awk '{print $2}' | sort | uniq -c
