# Session 23, device call 9 (the last): the GPU-bound dense cells under 1.0x in calls 3 and 5 (GELU / SwiGLU
# at H=4096, T=4096 and 16384; at H=1024, T=16384), measured again with sizes.py's interleaved rounds
# (call 8: at the power cap, interleaved, GELU T=16384 H=4096 ran 1.005x / 1.012x torch.compile).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 250 python3 -m benchmarks.sizes --part dense --H 4096 --T 4096 16384 --rounds 3 --reps 10 --out $OUT/sizes_h4096 > $OUT/sizes_h4096.log 2>&1
echo "h4096 rc=$? ($((SECONDS - S)) s)"
timeout $((330 - (SECONDS - S))) python3 -m benchmarks.sizes --part dense --H 1024 --T 16384 --rounds 3 --reps 10 --out $OUT/sizes_h1024 > $OUT/sizes_h1024.log 2>&1
echo "h1024 rc=$? ($((SECONDS - S)) s)"
python3 - <<'PY'
import json, os
for f in ("sizes_h4096", "sizes_h1024"):
    try:
        rows = json.load(open(os.environ["OUT"] + f"/{f}.json"))["rows"]
    except FileNotFoundError:
        continue
    for r in rows:
        print(f"{r['act']:6s} T={r['T']:<6d} H={r['H']:<5d} fo {r['fuseops_ms']:.2f} comp {r['fuseops_compiled_ms']:.2f} "
              f"torch {r['torch_ms']:.2f} tc {r.get('torch_compiled_ms') or 0:.2f} graphed {r['torch_graphed_ms'] or 0:.2f} "
              f"x {r['speedup']:.3f} enq {r['fuseops_enqueue_ms']:.2f}/{r['torch_enqueue_ms']:.2f}")
PY
