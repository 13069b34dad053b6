# Session 33, call 8 (run inline, written down here): the GPU tests of the changed per-tensor cast that call 3's
# quantize part did not reach before its limit (the large tensors, both per-tensor elements), and the quantized
# expert layer's GPU tests with the changed cast. Output: 12 passed, 271 deselected in 83.68 s.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/quantization/test_quantize.py \
  tests/moe/test_expert_layer_quantized.py -k "gpu_large and tensor or expert_layer_quantized" -rfE
