# Session 53, device call 10: the settings change (Sequential drops its caches) on the device's torch 2.11: the call
# cache, compile and Sequential test files (CPU and GPU tests).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout -s INT 170 python3 -m pytest -q -p no:cacheprovider tests/test_call_cache.py tests/test_sequential.py \
  tests/test_compile.py tests/test_compiled_sequential.py > $OUT/tests.log 2>&1; echo "tests rc=$?"
tail -3 $OUT/tests.log | cut -c1-200
