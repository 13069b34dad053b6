# Session 23, device call 2: call 1's models part stopped in test_model_bf16_on_gpu[qwen2_moe] (session 21
# passed it; here 157 tests took 379 s): that test alone with a stack dump if it hangs, then the offload
# tests (replay under offload is new since their last GPU run), then the rest of the models part.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 150 python3 -m pytest -p no:cacheprovider -q -o faulthandler_timeout=100 --durations=8 \
  tests/integrations/test_transformers.py -k "bf16_on_gpu" > $OUT/bf16_on_gpu.log 2>&1
echo "bf16_on_gpu rc=$? ($((SECONDS - S)) s)"; grep -E "passed|failed|^FAILED|Timeout|File .*fuseops|s call" $OUT/bf16_on_gpu.log | head -30 | cut -c1-200
timeout -s INT -k 10 260 python3 -m pytest -p no:cacheprovider -q --durations=8 tests/offload > $OUT/offload_tests.log 2>&1
echo "tests/offload rc=$? ($((SECONDS - S)) s)"; grep -E "passed|failed|^FAILED|^ERROR|s call" $OUT/offload_tests.log | tail -14 | cut -c1-200
timeout -s INT -k 10 $((585 - (SECONDS - S))) python3 -m pytest -p no:cacheprovider -q --durations=8 tests/integrations \
  -k "not bf16_on_gpu" > $OUT/integrations.log 2>&1
echo "tests/integrations rc=$? ($((SECONDS - S)) s)"; grep -E "passed|failed|^FAILED|^ERROR|s call" $OUT/integrations.log | tail -14 | cut -c1-200
echo "total $((SECONDS - S)) s"
