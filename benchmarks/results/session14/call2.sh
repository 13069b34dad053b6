# Session 14, device call 2: the MoE layer (issue 25: expert_layer against the composition at
# Mixtral, kernel by kernel; both shapes with Liger, 2 interleaved rounds), the FP8 layer's
# time by kernel at Qwen3 and its Mixtral rows (issue 24). Run with carry [".whl"].
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index .whl/liger_kernel-0.8.5-py3-none-any.whl > $OUT/liger_install.log 2>&1
python3 -c "import liger_kernel; print('liger', liger_kernel.__file__)"
timeout 120 python3 -m benchmarks.moe_layer_profile > $OUT/moe_layer_profile.log 2>&1; echo "profile rc=$?"
mkdir -p $OUT/moe
timeout 240 python3 -m benchmarks.moe_layer --impls fuseops "fuseops lean" "fuseops composed" torch liger \
  --rounds 2 --rep 100 --out-dir $OUT/moe > $OUT/moe_layer.log 2>&1; echo "moe_layer rc=$?"
timeout 90 python3 -m benchmarks.moe_profile --shape qwen3-30b-a3b --impls fuseops "fuseops fp8" --warmup-s 3 \
  > $OUT/moe_profile_fp8.log 2>&1; echo "moe_profile rc=$?"
timeout 110 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe_mixtral.json > $OUT/fp8_moe_mixtral.log 2>&1; echo "fp8_moe rc=$?"
tail -30 $OUT/moe_layer_profile.log | cut -c1-120
grep -E "TFLOP|GB|x " $OUT/moe_layer.log | tail -30 | cut -c1-140
tail -36 $OUT/moe_profile_fp8.log | cut -c1-120
tail -12 $OUT/fp8_moe_mixtral.log
