# Session 57, run 6: after the routing-graphs fix the compiled MoE composition ran at 0.90-0.93x of torch.compile
# (Qwen3 / OLMoE T=1024; 1.03-1.12x in run 2, before it), its enqueue 1.9-2.2 ms against 1.2-2.4, on a noisy host
# (torch.compile's own rounds 2.69 / 3.84 ms). A/B in one call (~4 min): sizes.py's T=1024 MoE cells on this tree,
# then on a copy with session 57's routing_graphs.py changes reversed (routing_graphs_session57.patch), then this tree
# again (session 58: the order's own effect on a noisy host).
rm -rf /tmp/before && mkdir /tmp/before && cp -r fuseops benchmarks tests pyproject.toml /tmp/before/
( cd /tmp/before && patch -R -p1 -s < benchmarks/results/session57/routing_graphs_session57.patch ) || echo "patch failed"
for side in after before after_again; do
  dir=.; [[ $side == before ]] && dir=/tmp/before
  ( cd "$dir" && timeout 110 python3 -m benchmarks.sizes --part moe --shapes qwen3 olmoe --T 1024 --rounds 2 \
      --out "$OUT_PART/sizes_$side" > "$OUT_PART/sizes_$side.log" 2>&1; echo "$side rc=$?" )
  grep -E "^(qwen3|olmoe) " "$OUT_PART/sizes_$side.log" | cut -c1-300
done
