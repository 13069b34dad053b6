"""GEMM main loops with their fused epilogues, dense and grouped (rows grouped by device
offsets: no host sync). Triton, persistent grids, TMA where operands are 16-byte aligned;
any CUDA GPU (TMA paths on sm_90+), and the interpreter on CPU. Float kernels take float32,
float16 and bfloat16 (fp32 accumulation); scaled kernels take the recipes' formats (TENSOR:
FP8 current scaling, BLOCK: FP8 blockwise, MX: MXFP8, NVFP4).

| module | launcher | computes | formats | reference |
| --- | --- | --- | --- | --- |
| ``dense`` | ``gemm`` | ``epilogue(a @ b)``: bias, activation (+ its grad), residual add | fp32/fp16/bf16 | ``reference_gemm`` |
| ``dense_gated`` | ``gemm_gated`` | ``gated(a @ b + bias)``: Linear + bias + GLU | fp32/fp16/bf16 | ``reference_gemm_gated`` |
| ``dense_scaled`` | ``gemm_scaled`` | ``dequant(a) @ dequant(b)^T (+ bias)``, or added to ``main_grad`` | all four recipes | ``reference_gemm_scaled`` |
| ``group_offsets`` | ``group_offsets`` | split sizes [G] -> int64 offsets [G + 1] on device | int | ``reference_group_offsets`` |
| ``grouped`` | ``grouped_gemm`` | per group ``epilogue(a_g @ b[g])`` (forward, dgrad, act grad; ``a_g`` optionally gathered by a row index) | fp32/fp16/bf16 | ``reference_grouped_gemm`` |
| ``grouped_gated`` | ``grouped_gemm_gated`` | FC1 of a gated expert MLP: ``gated(a_g @ b[g] + bias[g])`` (``a_g`` optionally gathered) | fp32/fp16/bf16 | ``reference_grouped_gemm_gated`` |
| ``grouped_gated_bwd`` | ``grouped_gemm_dgrad_gated`` | FC2's dgrad with the gate's derivative (and dprobs) in the epilogue (``dy_g`` optionally gathered) | fp32/fp16/bf16 | ``reference_grouped_gemm_dgrad_gated`` |
| ``grouped_wgrad`` | ``grouped_gemm_wgrad``, ``grouped_bias_grad`` | ``dw[g] = dy_g^T @ x_g`` (or into float32 ``main_grad``; ``x_g`` and ``dy_g`` optionally gathered by a row index), ``db[g]`` | fp32/fp16/bf16 | ``reference_grouped_gemm_wgrad``, ``reference_grouped_bias_grad`` |
| ``grouped_scaled`` | ``grouped_gemm_scaled`` | per group ``dequant(a_g) @ dequant(b[g])^T (+ bias[g])`` | all four recipes | ``reference_grouped_gemm_scaled`` |
| ``grouped_scaled_act`` | ``grouped_gemm_scaled_act`` | FC1 under a recipe with the activation and FC2's quantized input in the epilogue | MXFP8, NVFP4 (fusion's guard) | ``reference_grouped_gemm_scaled_act`` |
| ``grouped_scaled_dgrad_gated`` | ``grouped_gemm_scaled_dgrad_gated`` | FC2's quantized dgrad with the gate's derivative, dprobs, and dz in FC1's gradient format in the epilogue | all four recipes | ``reference_grouped_gemm_scaled_dgrad_gated`` |
| ``grouped_scaled_wgrad`` | ``grouped_gemm_scaled_wgrad`` | ``dw[g]`` from the column-wise quantized copies | all four recipes | ``reference_grouped_gemm_scaled_wgrad`` |
| ``wgrad_walk`` | ``n_fastest`` | the wgrads' tile walk order (host maths + a jit helper) | - | - |

On sm_90 the dispatch table sends FP8 blockwise GEMMs and the bf16 / fp16 grouped wgrad
with TMA-ready operands (and no row gather) to ``hopper/`` instead.
"""

# The modules are the package's public names; the package itself defines nothing.
__all__ = [
    "dense", "dense_cublas", "dense_gated", "dense_scaled", "group_offsets", "grouped",
    "grouped_gated", "grouped_gated_bwd", "grouped_scaled", "grouped_scaled_act",
    "grouped_scaled_dgrad_gated", "grouped_scaled_wgrad", "grouped_wgrad", "traced", "wgrad_walk",
]
