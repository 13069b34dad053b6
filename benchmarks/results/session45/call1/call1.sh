# Prepared in session 44 for branch `compiled-check-memo` (CPU-tested only): a compiled Sequential's real call
# checks its results once per recorded program (`_Runner.checked`). Merge after this call passes: the compile tests
# on the device's torch, the `graphs` part, and the dense cells where the compiled step is host-bound, against
# torch.compile in the same run (session 44's call 2 on main: GELU H=1024 T=1024 / 4096 1.185x / 0.804x, H=2048
# T=1024 / 4096 1.060x / 0.975x; SwiGLU 1.279x / 0.951x, 0.960x / 1.046x).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_compile.py tests/test_compiled_sequential.py \
  > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/compile_tests.log | cut -c1-200; tail -1 $OUT/compile_tests.log
LIMIT=150 bash benchmarks/run_gpu.sh graphs 2>&1 | tail -3
S=$SECONDS
timeout $((580 - SECONDS)) python3 -m benchmarks.sizes --part dense --T 1024 4096 --H 1024 2048 --out $OUT/sizes_dense \
  > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"
python3 - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/sizes_dense.json"))["rows"]
print("act     T     H  eager/best  comp/tcomp  comp/eager  fc busy  tc busy")
for r in rows:
    best = min(r["torch_ms"], r["torch_compiled_ms"])
    print(f"{r['act']:6s} {r['T']:5d} {r['H']:5d}  {best / r['fuseops_ms']:9.3f}  {r['torch_compiled_ms'] / r['fuseops_compiled_ms']:9.3f}"
          f"  {r['fuseops_ms'] / r['fuseops_compiled_ms']:9.3f}  {r['fuseops_compiled_busy_enqueue_ms']:7.2f}  {r['torch_compiled_busy_enqueue_ms']:7.2f}")
PY
