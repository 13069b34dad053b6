# Session 14, device call 3: the MoE layer's table (issue 25: peak above the step's start and
# fwd+bwd TFLOP/s, default and lean, against plain torch and Liger, per shape, 2 interleaved
# rounds), its GPU tests in both modes; compile and CUDA graphs on the GPU (issue 20).
# Run with carry [".whl"].
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index .whl/liger_kernel-0.8.5-py3-none-any.whl > $OUT/liger_install.log 2>&1
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/moe/test_expert_layer.py \
  tests/test_compile.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-200; tail -1 $OUT/tests.log
for shape in qwen3-30b-a3b mixtral-8x7b; do
  mkdir -p $OUT/$shape
  timeout 190 python3 -m benchmarks.moe_layer --shapes $shape --impls fuseops "fuseops lean" torch liger \
    --rounds 2 --rep 100 --no-graph --out-dir $OUT/$shape > $OUT/moe_layer_$shape.log 2>&1; echo "moe_layer $shape rc=$?"
done
for shape in qwen3-30b-a3b mixtral-8x7b; do tail -14 $OUT/moe_layer_$shape.log | cut -c1-150; done
