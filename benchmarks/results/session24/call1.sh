# Session 24, device call 1: GPU tests of session 23's replay under autocast (the executor tests,
# test_compile's gpu tests) and the autocast benchmark's dense stack with replay on and off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 200 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/ops/executor > $OUT/executor.log 2>&1
echo "executor rc=$? ($((SECONDS - S)) s)"; tail -3 $OUT/executor.log
timeout -s INT 200 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_compile.py > $OUT/compile.log 2>&1
echo "compile rc=$? ($((SECONDS - S)) s)"; tail -3 $OUT/compile.log
for r in 1 0; do
  FUSEOPS_REPLAY=$r timeout 100 python3 -m benchmarks.autocast --models dense --rounds 3 --out $OUT/autocast_replay$r.json > $OUT/autocast_replay$r.log 2>&1
  echo "autocast replay=$r rc=$? ($((SECONDS - S)) s)"; tail -4 $OUT/autocast_replay$r.log
done
