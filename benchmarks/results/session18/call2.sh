# Session 18, device call 2: where the mlp stack's 3-4 % under "auto" goes (issue 23; call 1
# measured 1.039x interleaved), and the compile GPU tests (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/session18/offload_ab.py --stacks mlp moe attn --rounds 4 > $OUT/offload_ab.log 2>&1; echo "ab rc=$?"
timeout -s INT -k 10 120 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_compile.py > $OUT/tests_compile.log 2>&1
echo "compile tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_compile.log | cut -c1-220; tail -1 $OUT/tests_compile.log
cat $OUT/offload_ab.log | tail -20
