# Session 57's routing-graphs fix (a row map names the permute state that made it, eager or graphed) on the GPU
# (~4 min): the offload benchmark's MoE stack, whose graph states never settled without offload in run 1 (3.3
# captures a step), then tests/moe/test_routing_graphs.py (its GPU tests and the CPU stand-in tests, the new one
# among them, on the device's torch 2.11).
timeout 240 python3 -m benchmarks.offload --steps 6 --rounds 5 --stacks moe --out "$OUT_PART/offload_moe" \
  > "$OUT_PART/offload_moe.log" 2>&1
echo "offload moe rc=$?"
grep -E "^moe:|\* auto|^ +none|^ +0 hooks|^ +all|against none|did not settle|captures while timed" \
  "$OUT_PART/offload_moe.log" | cut -c1-200
timeout 240 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/moe/test_routing_graphs.py \
  > "$OUT_PART/routing_graphs.log" 2>&1
echo "routing graphs rc=$?"; tail -3 "$OUT_PART/routing_graphs.log" | cut -c1-200
