# Session 24, device call 12: GPU tests of what graphs v2 and replay.py touch: the executor tests (replay,
# autocast, graphs), test_compile's gpu tests, the integrations and the offload tests (replay's receivers).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
run() { name=$1; shift; timeout -s INT $1 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short "${@:2}" > $OUT/$name.log 2>&1
  echo "$name rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/$name.log | cut -c1-300 | head -10; tail -1 $OUT/$name.log; }
run executor 150 tests/ops/executor
run compile 130 -m gpu tests/test_compile.py
run integrations 120 tests/integrations
run offload 170 tests/offload
