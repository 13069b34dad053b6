# Session 23, device call 3: recorded programs now call the stored entry point of kernels that read
# immutable globals (the grouped GEMMs: _BIG, _UPCAST_BF16_DOT; the Gluon wgrad), guarded by the globals'
# identity. The launch tests on the GPU; the CUDA property suite of GroupedMLP (replayed call bit for
# bit); the MoE cells of replay_ab before (build/base = HEAD~1) and after; then the dense sizes cells at
# H=1024 (eager and compiled, torch eager, compiled and graphed), as many as fit.
export PYTHONUNBUFFERED=1
S=$SECONDS
PYTHONPATH=. timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_launch.py > $OUT/launch_tests.log 2>&1
echo "launch gpu tests rc=$? ($((SECONDS - S)) s)"; tail -2 $OUT/launch_tests.log | cut -c1-200
for tree in base new; do
  [ $tree = base ] && P=build/base:. || P=.
  PYTHONPATH=$P timeout 150 python3 benchmarks/results/session23/replay_ab.py --cells qwen3_1k olmoe_1k qwen3_4k --reps 20 --rounds 3 > $OUT/moe_ab_$tree.log 2>&1
  echo "moe replay_ab $tree rc=$? ($((SECONDS - S)) s)"; grep -E "^(moe|cell)" $OUT/moe_ab_$tree.log | cut -c1-200
done
PYTHONPATH=. LIMIT=170 bash benchmarks/run_gpu.sh props "GroupedMLP and not Quantized"
echo "props ($((SECONDS - S)) s)"
PYTHONPATH=. timeout $((585 - (SECONDS - S))) python3 -m benchmarks.sizes --part dense --H 1024 --out $OUT/sizes_dense_h1024 > $OUT/sizes.log 2>&1
echo "sizes rc=$? ($((SECONDS - S)) s)"; grep -E "^\{" $OUT/sizes.log | python3 -c "
import sys, ast
for l in sys.stdin:
    r = ast.literal_eval(l)
    print(r['act'], r['T'], r['H'], 'fo %.2f comp %.2f torch %.2f tc %s graphed %s speedup %.2f enq %.2f/%.2f' % (r['fuseops_ms'], r['fuseops_compiled_ms'], r['torch_ms'], r.get('torch_compiled_ms'), r['torch_graphed_ms'], r['speedup'], r['fuseops_enqueue_ms'], r['torch_enqueue_ms']))"
