# Prepared in session 51 for the next device session. One call each; every part writes under $OUT as it goes.
#   bash benchmarks/results/session51/next_device_calls.sh tests     # ~4 min: the kernels tests run 13 did not reach,
#                                                                    # the graphs part (drop reasons, session 51)
#   bash benchmarks/results/session51/next_device_calls.sh why_eager # ~4 min: SwiGLU H=4096, why four programs went
#                                                                    # eager during the timed rounds (run 3: host 5.14
#                                                                    # against torch's 4.51 ms at T=4096)
#   bash benchmarks/results/session51/next_device_calls.sh ab        # ~7 min: where why_eager names "a graph whose
#                                                                    # inputs left other graphs' memory (GPU-bound)",
#                                                                    # T=4096 on main, then on a copy with
#                                                                    # remeasure_after_producer_left.patch (such a
#                                                                    # program measured again, not eager for good)
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
case "${1:-}" in
  tests)
    timeout 150 python3 -m pytest -p no:cacheprovider -q -m gpu tests/kernels/quantization/test_formats.py \
      tests/kernels/test_dense_dispatch.py tests/kernels/test_dispatch.py tests/kernels/test_launch.py \
      > $OUT/kernels_rest.log 2>&1; echo "kernels rest rc=$?"; tail -1 $OUT/kernels_rest.log
    LIMIT=240 bash benchmarks/run_gpu.sh graphs ;;
  why_eager)
    timeout 400 python3 -m benchmarks.sizes --part dense --acts swiglu --H 4096 --T 1024 4096 --rounds 2 \
      --out $OUT/why_eager > $OUT/why_eager.log 2>&1; echo "why_eager rc=$?"
    grep -E "^cell|^swiglu|CUDA-graph" $OUT/why_eager.log | cut -c1-400
    python3 -c "
import json
for r in json.load(open('$OUT/why_eager.json'))['rows']:
    print(r['act'], r['H'], r['T'], r['fuseops_enqueue_ms'], r['torch_enqueue_ms'], r.get('fuseops_graph_refusals'))" ;;
  ab)
    rm -rf /tmp/patched && mkdir /tmp/patched && cp -r fuseops benchmarks /tmp/patched/ \
      && (cd /tmp/patched && patch -p1 < benchmarks/results/session51/remeasure_after_producer_left.patch)
    for side in main patched; do
      dir=.; [ $side = patched ] && dir=/tmp/patched
      (cd $dir && PYTHONPATH=. timeout 200 python3 -m benchmarks.sizes --part dense --acts swiglu --H 4096 --T 4096 \
        --rounds 2 --out $OUT/ab_$side > $OUT/ab_$side.log 2>&1; echo "$side rc=$?")
      grep -E "^swiglu|CUDA-graph" $OUT/ab_$side.log | cut -c1-400
    done ;;
  *) echo "usage: $0 tests|why_eager|ab" ;;
esac
