# Session 64's settings_key (one guard an op where settings() traced guarded each setting: 685 -> 505 leaf guards on
# the CPU's 4-block stack), A/B on one machine: the compiled dense cells at H=1024 (the host floor, run 6) with this
# tree ("key") and with a copy where describe() traces settings() again ("settings"), alternating; then the guards'
# own cost per side (session 55's compiled_guards.py: host with guards evaluated against skipped).
rm -rf /tmp/ab && mkdir -p /tmp/ab && cp -r fuseops benchmarks pyproject.toml /tmp/ab/
sed -i 's/tuple(\[op.settings_key for op in ops\])/tuple([(op.class_code, op.settings()) for op in ops])/' \
  /tmp/ab/fuseops/compiled_sequential.py
grep -c "op.class_code, op.settings()" /tmp/ab/fuseops/compiled_sequential.py
for side in key settings key settings; do
  root=$PWD; [[ $side == settings ]] && root=/tmp/ab
  (cd "$root" && PYTHONPATH=$root timeout ${SIZES_LIMIT:-130} python3 -m benchmarks.sizes --part dense --H 1024 \
    --T 1024 4096 --rounds 1 --out "$OUT_PART/sizes_$side" > "$OUT_PART/sizes_$side.log" 2>&1)
  echo "== $side rc=$?"; grep -A4 "^cell" "$OUT_PART/sizes_$side.log" | cut -c1-110
  mv "$OUT_PART/sizes_$side.log" "$OUT_PART/sizes_${side}_$(date +%s).log"
done
for side in key settings; do
  root=$PWD; [[ $side == settings ]] && root=/tmp/ab
  (cd "$root" && PYTHONPATH=$root timeout 100 python3 benchmarks/results/session55/compiled_guards.py \
    --cells gelu:1024:1024 swiglu:1024:1024 --pairs 60 2>&1 | grep -v Warn | tee "$OUT_PART/guards_$side.log")
done
