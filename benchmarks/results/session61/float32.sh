# Session 61: a float32 model end to end (parameters and inputs float32, no autocast), as a user who never asks for
# mixed precision runs it: sizes.py's dense cells with the dispatch table (float32 always cuBLAS, session 60) and with
# every row pinned to the fused Triton kernels (FUSEOPS_DENSE_DISPATCH=fused: what float32 ran before session 60).
export PYTHONPATH=. PYTHONUNBUFFERED=1
for side in table fused; do
  pin=table; [[ $side == fused ]] && pin=fused
  FUSEOPS_DENSE_DISPATCH=$pin timeout ${SIDE_LIMIT:-230} python3 -m benchmarks.sizes --part dense --dtype float32 \
    --acts ${ACTS:-gelu swiglu} --H ${HS:-1024 2048} --T ${TS:-1024 4096} --rounds 1 --reps 10 \
    --out "$OUT_PART/float32_$side" > "$OUT_PART/float32_$side.log" 2>&1
  echo "$side rc=$?"
  grep -hE "^(gelu|swiglu) " "$OUT_PART/float32_$side.log" | cut -c1-170
done
