# Session 40, call 2: the second stage of the row reductions (`bias_grad.sum_partials`) under other tiles, and the
# norm backward with the best of them (partials_sweep.py; call 1's LayerNorm library was ~10 us behind its own tile:
# dbias's second sum_partials); the norm forward's new tiles (_FORWARD) against the old at RMS and LayerNorm. Then
# the GPU tests of the elementwise kernels (the GELU dbias tile and the norm forward's changed) and the CUDA edge
# cases of the norms and activations. ~7 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 330 python3 benchmarks/results/session40/partials_sweep.py > $OUT/partials_sweep.log 2>&1
echo "partials sweep rc=$? ($((SECONDS - S)) s)"; grep -E "^partials|^  +[0-9.]+ us|bwd|fwd" $OUT/partials_sweep.log | awk '/^partials/{n=0} {if (n++ < 3) print}' | cut -c1-150
S=$SECONDS
timeout -s INT -k 10 100 python3 -m pytest -p no:cacheprovider -q -m gpu tests/kernels/elementwise > $OUT/gpu_elementwise.log 2>&1
echo "gpu elementwise rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/gpu_elementwise.log | cut -c1-200; tail -1 $OUT/gpu_elementwise.log
LIMIT=120 bash benchmarks/run_gpu.sh edge "BackwardBiasActivation or LayerNorm or RMSNorm" 2>&1 | tail -4
