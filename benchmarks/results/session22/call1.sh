# Session 22, device call 1: issue 23's retried efficiency cut (merged in session 21, not yet run on a GPU),
# A/B on one machine: the moe stack with the code before it (2bf647b, build/base) and HEAD, alternated
# twice; then HEAD's three stacks; then the norm kernels' correctly rounded row mean (session 21) against
# the code before it (4e353b6, build/norm_base): benchmarks/elementwise.py, both trees.
export PYTHONUNBUFFERED=1
S=$SECONDS
for i in 1 2; do
  for r in build/base .; do
    PYTHONPATH=$r:. timeout 150 python3 -m benchmarks.offload --stacks moe --steps 6 --rounds 5 --out $OUT/offload_moe_${i}_$(basename $r) \
      > $OUT/offload_moe_${i}_$(basename $r).log 2>&1
    echo "[$r] round $i rc=$? ($((SECONDS - S)) s)"
    grep -E "^\s+(\* auto|none|0 hooks)|against none|calibrat|settled" $OUT/offload_moe_${i}_$(basename $r).log | cut -c1-230
  done
done
for r in build/norm_base .; do
  PYTHONPATH=$r:. timeout 120 python3 benchmarks/elementwise.py --out $OUT/elementwise_$(basename $r) > $OUT/elementwise_$(basename $r).log 2>&1
  echo "[$r] elementwise rc=$? ($((SECONDS - S)) s)"; grep -i -E "norm|shape" $OUT/elementwise_$(basename $r).log | cut -c1-160
done
if [ $((SECONDS - S)) -lt 420 ]; then
  PYTHONPATH=. timeout $((580 - (SECONDS - S))) python3 -m benchmarks.offload --steps 6 --rounds 5 --out $OUT/offload3 > $OUT/offload3.log 2>&1
  echo "3 stacks rc=$? ($((SECONDS - S)) s)"
  grep -E "^(mlp|attn|moe):|\* auto|against none|calibrat" $OUT/offload3.log | cut -c1-230
fi
