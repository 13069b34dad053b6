# Session 44, call 2: the compiled Sequential's leaner glue (``compiled_sequential._Runner``: a real call finds its
# Sequential's ops and run by one dict lookup and an identity check; ``_new_carried``'s positions split at trace
# time; ``saved_state.fill_records`` inlined). Its tests on the device's torch 2.11 (both files whole: CPU and GPU
# tests), then issue 20's dense table (compiled fuseops against torch.compile, every cell, as far as time goes).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_compile.py tests/test_compiled_sequential.py \
  > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/compile_tests.log | cut -c1-200; tail -1 $OUT/compile_tests.log
S=$SECONDS
timeout $((575 - SECONDS)) python3 -m benchmarks.sizes --part dense --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"
python3 - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/sizes_dense.json"))["rows"]
print("act     T     H  eager/best  comp/tcomp  f busy  fc busy  tc busy  t busy")
for r in rows:
    best = min(r["torch_ms"], r["torch_compiled_ms"])
    print(f"{r['act']:6s} {r['T']:5d} {r['H']:5d}  {best / r['fuseops_ms']:9.3f}  {r['torch_compiled_ms'] / r['fuseops_compiled_ms']:9.3f}"
          f"  {r['fuseops_busy_enqueue_ms']:6.2f}  {r['fuseops_compiled_busy_enqueue_ms']:7.2f}  {r['torch_compiled_busy_enqueue_ms']:7.2f}"
          f"  {r['torch_busy_enqueue_ms']:6.2f}")
PY
