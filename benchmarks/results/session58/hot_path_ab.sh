# Session 58 added a few reads to every call: run_prepared reads forward_ad's level (and asks torch.func's state
# before the no-grad branch), permute / unpermute ask whether torch differentiates them (maybe_current_level +
# forward_ad's level), launcher reads a flag. ~100-200 ns a call on the CPU, no change measured there (host A/B, 2
# pairs). On the H100 (~6 min): sizes.py's host-bound dense GELU cell (H=1024, T=1024) and the MoE T=1024 cells, on
# this tree, then on a copy with fuseops/ at e2cbdbe (session 58's whole fuseops diff reversed: hot_path_session58.patch), then this
# tree again; compare enqueue ms (host) and step ms.
rm -rf /tmp/before && mkdir /tmp/before && cp -r fuseops benchmarks tests pyproject.toml /tmp/before/
# PATCH: another session's diff to reverse (session 59's hot_path_ab.sh passes its own).
( cd /tmp/before && git apply -R "${PATCH:-benchmarks/results/session58/hot_path_session58.patch}" ) || echo "patch failed"
for side in after before after_again; do
  dir=.; [[ $side == before ]] && dir=/tmp/before
  ( cd "$dir" && timeout 100 python3 -m benchmarks.sizes --part dense --acts gelu --H 1024 --T 1024 --rounds 2 \
      --out "$OUT_PART/dense_$side" > "$OUT_PART/dense_$side.log" 2>&1; echo "$side dense rc=$?"
    timeout 80 python3 -m benchmarks.sizes --part moe --shapes qwen3 --T 1024 --rounds 2 \
      --out "$OUT_PART/moe_$side" > "$OUT_PART/moe_$side.log" 2>&1; echo "$side moe rc=$?" )
  grep -hE "^(gelu|swiglu|qwen3) " "$OUT_PART/dense_$side.log" "$OUT_PART/moe_$side.log" | cut -c1-300
done
