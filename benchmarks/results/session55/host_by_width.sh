# Why a drained step's host grows with H at T=1024 with every program graphed (run 3: fuseops enqueue 1.09 ms at GELU
# H=1024 against 1.77 at H=2048, busy 1.08 / 1.56; torch eager's 1.57 / 1.85): session 39's drained_profile.py at
# both widths (~3 min), tottime and cumulative tables per model.
for cell in gelu:1024:1024 gelu:1024:2048; do
  timeout 150 python3 benchmarks/results/session39/drained_profile.py --cell $cell --top 30 2>&1 | grep -v Warn \
    > "$OUT_PART/drained_${cell//:/_}.log"
  echo "$cell rc=$?"; grep -E "^====|function calls" "$OUT_PART/drained_${cell//:/_}.log" | cut -c1-160
done
