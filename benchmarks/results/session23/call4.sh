# Session 23, device call 4: the CUDA property suite of GroupedMLP (its replayed third call bit for bit,
# now through the grouped GEMMs' stored entry points; call 3 cut it at 170 s on a fresh machine), then
# the MoE sizes cells (every shape, token count and routing; 10 reps a variant; the JSON is written
# after every cell, so a time limit keeps what was measured).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
LIMIT=290 bash benchmarks/run_gpu.sh props "GroupedMLP and not ForwardQuantized"
echo "props ($((SECONDS - S)) s)"
timeout $((588 - (SECONDS - S))) python3 -m benchmarks.sizes --part moe --reps 10 --out $OUT/sizes_moe > $OUT/sizes.log 2>&1
echo "sizes rc=$? ($((SECONDS - S)) s)"
python3 - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/sizes_moe.json"))["rows"]
for r in rows:
    print(f"{r['shape']:8s} T={r['T']:<6d} {r['routing']:8s} fo {r['fuseops_ms']:.2f} comp {r['fuseops_compiled_ms']:.2f} "
          f"torch {r['torch_ms']:.2f} tc {r.get('torch_compiled_ms') or 0:.2f} graphed {r['torch_graphed_ms'] or 0:.2f} "
          f"x {r['speedup']:.2f} enq {r['fuseops_enqueue_ms']:.2f}/{r['torch_enqueue_ms']:.2f} {r['fuseops_replay_counts']}")
PY
