# Session 52, device call 1: the compiled-kernels probe, a drained host profile of the GELU H=2048 T=1024 cell (the
# host-bound cell at 1.12x), then session 51's why_eager at T=4096 only.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 170 python3 benchmarks/results/session52/compiled_kernels.py --cells gelu:1024:4096 swiglu:1024:4096 \
  > $OUT/compiled_kernels.log 2>&1; echo "compiled_kernels rc=$?"
timeout 100 python3 benchmarks/results/session39/drained_profile.py --cell gelu:1024:2048 --top 30 \
  > $OUT/drained_profile.log 2>&1; echo "drained_profile rc=$?"
timeout 290 python3 -m benchmarks.sizes --part dense --acts swiglu --H 4096 --T 4096 --rounds 2 \
  --out $OUT/why_eager > $OUT/why_eager.log 2>&1; echo "why_eager rc=$?"
grep -E "^swiglu|CUDA-graph" $OUT/why_eager.log | cut -c1-300
python3 -c "
import json
for r in json.load(open('$OUT/why_eager.json'))['rows']:
    print(r['act'], r['H'], r['T'], r['fuseops_enqueue_ms'], r['torch_enqueue_ms'], r.get('fuseops_graph_refusals'))"
grep -A14 "kernels differing" $OUT/compiled_kernels.log | cut -c1-200
