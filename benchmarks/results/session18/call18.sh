# Session 18, device call 18: localise call 17's compiled FP8 failures: aot_eager (the same graph,
# no inductor code generation) for both recipes, and blockwise under inductor with the launch
# checks on (FUSEOPS_CHECK_LAUNCH=1: stored keys and kept tensor descriptors compared with fresh ones).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s=benchmarks/results/session18/fp8_user_checks.py
for r in blockwise current; do
  CHECK_BACKEND=aot_eager timeout 100 python3 $s compile $r 256 > $OUT/aot_$r.log 2>&1; echo "aot_eager $r rc=$?"; grep "^T=" $OUT/aot_$r.log
  grep -m1 "Assertion" $OUT/aot_$r.log | cut -c1-200; grep -m1 -E "^[A-Za-z.]*Error" $OUT/aot_$r.log | cut -c1-200
done
FUSEOPS_CHECK_LAUNCH=1 timeout 100 python3 $s compile blockwise 256 > $OUT/check_blockwise.log 2>&1; echo "check blockwise rc=$?"; grep "^T=" $OUT/check_blockwise.log
grep -m1 -E "^[A-Za-z.]*Error" $OUT/check_blockwise.log | cut -c1-250
