# Session 19, device call 6: the quantized custom ops under torch.compile (helper-29): their GPU
# tests, then session 18's user check (float32 weights under autocast, E=16, inductor) per recipe.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 400 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/quant/test_compile.py > $OUT/tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-250; tail -1 $OUT/tests.log
for r in blockwise current; do
  [ $((SECONDS - S)) -gt 480 ] && break
  timeout 60 python3 benchmarks/results/session18/fp8_user_checks.py compile $r 256 > $OUT/user_$r.log 2>&1; echo "user check compile $r rc=$?"; grep "^T=" $OUT/user_$r.log
done
