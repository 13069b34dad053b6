# The two cells below target in calls 2-3 (GELU T=4096 H=1024 eager 0.93x; SwiGLU T=1024 H=2048 compiled 0.89x of
# torch.compile), three interleaved rounds each, once more on this machine.
for cell in "gelu 4096 1024" "swiglu 1024 2048"; do
  set -- $cell
  timeout ${RECHECK_LIMIT:-150} python3 -m benchmarks.sizes --part dense --acts $1 --T $2 --H $3 --rounds 3 \
    --out "$OUT_PART/sizes_$1_$2_$3" > "$OUT_PART/sizes_$1_$2_$3.log" 2>&1; echo "$cell rc=$?"
  grep -E "^(gelu|swiglu) " "$OUT_PART/sizes_$1_$2_$3.log" | cut -c1-160
done
