# Session 18, device call 17: call 16's device-side assert under torch.compile, case by case
# (each compiled case in its own process), and the eager checks against float64.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s=benchmarks/results/session18/fp8_user_checks.py
timeout 120 python3 $s eager none,current,blockwise 256,1024 > $OUT/eager.log 2>&1; echo "eager rc=$?"; grep "^T=" $OUT/eager.log
for r in none current blockwise; do
  timeout 120 python3 $s compile $r 256 > $OUT/compile_$r.log 2>&1; echo "compile $r rc=$?"; grep "^T=" $OUT/compile_$r.log
  grep -m1 "Assertion" $OUT/compile_$r.log | cut -c1-200; grep -m1 -E "^[A-Za-z.]*Error" $OUT/compile_$r.log | cut -c1-200
done
