# Session 18, device call 11: issue 23 on the final offload code (the save notice, the digest
# deferred to the second group, a step planning with the profile it began with, the backward
# split into offload/backward.py): GPU offload tests, then the benchmark with 5 interleaved rounds.
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT -k 10 120 $q tests/offload > $OUT/tests_offload.log 2>&1
echo "offload tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_offload.log | cut -c1-220; tail -1 $OUT/tests_offload.log
timeout 420 python3 -m benchmarks.offload --out $OUT --steps 6 --rounds 5 > $OUT/offload.log 2>&1; echo "offload rc=$?"
grep -E "^(mlp|attn|moe):|auto|none |all " $OUT/offload.log | grep -v "auto profile" | cut -c1-300
