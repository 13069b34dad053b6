# Session 15, device call 8: the offload curve after the host-cost cuts, with auto against none
# in interleaved rounds (issue 23).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 300 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
grep -B1 -A14 "^mlp\|^attn\|^moe" $OUT/offload.log | cut -c1-160 | head -60
