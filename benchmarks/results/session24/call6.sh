# Session 24, device call 6: why captures after the first test stay eager (call 3, 4): the refusal reasons.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -vv -rfE --tb=short tests/ops/executor/test_graphed.py -k "dense_gelu or empty or saved_input" > $OUT/graphed.log 2>&1
echo "graphed rc=$?"; grep -E "^(FAILED|ERROR|E  )" $OUT/graphed.log | cut -c1-900 | head -30; tail -2 $OUT/graphed.log
