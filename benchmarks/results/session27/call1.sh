# Session 27, device call 1: session 26's changes after its call 10 on the GPU (empty-result plan,
# the _Written copy cut, routing memory / key caps, weak owners), compile after the written-input and
# routing changes; then why routing states were dropped, the MoE sizes at T=1024, a 16-layer MoE stack.
export PYTHONPATH=. PYTHONUNBUFFERED=1
t() { S=$SECONDS; name=$1; lim=$2; shift 2
  timeout -s INT -k 10 $lim python3 -m pytest -q -p no:cacheprovider -m gpu --tb=short "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/$name.log | cut -c1-250 | head -12; tail -1 $OUT/$name.log; }
t executor 110 tests/ops/executor
t compile 130 tests/test_compile.py
t moe 160 tests/moe
S=$SECONDS
timeout 70 python3 benchmarks/results/session26/routing_states.py 1024 > $OUT/routing_states.log 2>&1
echo "routing_states rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
timeout 90 python3 benchmarks/results/session26/moe_stack.py --T 1024 4096 > $OUT/moe_stack.log 2>&1
echo "moe_stack rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
grep -v "Warn\|warn" $OUT/routing_states.log | cut -c1-200 | head -60
grep -v "Warn\|warn" $OUT/moe_stack.log | tail -20 | cut -c1-200
