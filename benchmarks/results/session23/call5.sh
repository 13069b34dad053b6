# Session 23, device call 5: the dense sizes cells at H=2048 and 4096 (GELU and SwiGLU, T=1024/4096/16384;
# call 3 ran H=1024), then the quantize kernel tests (run_gpu.sh quantize; last run in session 19) in
# what time is left.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 420 python3 -m benchmarks.sizes --part dense --H 2048 4096 --out $OUT/sizes_dense_h2048_4096 > $OUT/sizes.log 2>&1
echo "sizes rc=$? ($((SECONDS - S)) s)"
python3 - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/sizes_dense_h2048_4096.json"))["rows"]
for r in rows:
    print(f"{r['act']:6s} T={r['T']:<6d} H={r['H']:<5d} fo {r['fuseops_ms']:.2f} comp {r['fuseops_compiled_ms']:.2f} "
          f"torch {r['torch_ms']:.2f} tc {r.get('torch_compiled_ms') or 0:.2f} graphed {r['torch_graphed_ms'] or 0:.2f} "
          f"x {r['speedup']:.2f} enq {r['fuseops_enqueue_ms']:.2f}/{r['torch_enqueue_ms']:.2f} hb {r['host_bound']}")
PY
LIMIT=$((585 - (SECONDS - S))) bash benchmarks/run_gpu.sh quantize
echo "total $((SECONDS - S)) s"
