# Issue 25 (MoE layer memory): GPU tests of expert_layer and the gathered wgrad, then the
# benchmark (both modes, the composition, plain torch, Liger where it installs).
# Run with carry [".whl"] (liger_kernel-0.8.5 wheel, pip download'ed on the CPU machine).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
pip install -q --no-deps --no-index .whl/liger_kernel-0.8.5-py3-none-any.whl > $OUT/liger_install.log 2>&1; echo "liger install rc=$?"
timeout -s INT 200 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu \
  tests/moe/test_expert_layer.py tests/kernels/gemm/test_grouped_wgrad.py tests/moe/test_moe_layer.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-200; tail -1 $OUT/tests.log
timeout 360 python3 -m benchmarks.moe_layer --impls fuseops "fuseops lean" "fuseops composed" liger --rep 100 \
  --out-dir $OUT > $OUT/moe_layer.log 2>&1; echo "moe_layer rc=$?"
tail -22 $OUT/moe_layer.log
