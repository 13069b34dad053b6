# Session 16, device call 5: the offload scheduler's CUDA-call cuts (issue 23: event and fence
# reuse, cached current stream, set_stream copies, fewer queries): the GPU offload tests
# (bitwise gradients, no host sync, no pinned allocation after warm-up), the host breakdown
# against session 15's, and the curve with auto against none interleaved.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/offload > $OUT/tests_offload.log 2>&1
echo "offload tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_offload.log | cut -c1-220; tail -1 $OUT/tests_offload.log
timeout 100 python3 -m benchmarks.offload_host --cuda --steps 10 --stacks mlp,moe > $OUT/offload_host.log 2>&1; echo "offload_host rc=$?"
timeout 290 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
cat $OUT/offload_host.log | head -12
grep -B1 -A14 "^mlp\|^attn\|^moe" $OUT/offload.log | cut -c1-160 | grep -v "^ *[0-9]\{8,\}" | head -60
