"""Warp-specialized Gluon GEMMs for Hopper (sm_90 only; never under the interpreter): a TMA
producer warp fills a ring of shared-memory stages, two consumer warpgroups run the wgmma
of each tile's two halves (or, in ``tensor_scaled``, of alternate whole tiles). The dispatch
table routes calls here when ``serves*`` holds (TMA-ready operands, the format); elsewhere
gemm/'s Triton kernels run.

| module | launcher (dispatch row) | computes | formats | reference |
| --- | --- | --- | --- | --- |
| ``blockwise`` | ``gemm_scaled``, ``grouped_gemm_scaled`` | dense / grouped FP8 GEMM, 1x128 and 128x128 scales rescaled per 128-long K step | FP8 blockwise | gemm/dense_scaled's / grouped_scaled's references |
| ``tensor_scaled`` | ``grouped_gemm_scaled`` | grouped FP8 GEMM (forward, dgrad), one scale per group and operand applied to the result, the consumers on alternate whole tiles; bf16 / fp16 out | FP8 current scaling | gemm/grouped_scaled's reference |
| ``tensor_scaled_wgrad`` | ``grouped_gemm_scaled_wgrad`` | grouped FP8 weight gradient, the groups' two scales applied to the result, written in bf16 / fp16 or added to float32 ``main_grad`` | FP8 current scaling | gemm/grouped_scaled_wgrad's reference |
| ``blockwise_wgrad`` | ``grouped_gemm_scaled_wgrad`` | grouped FP8 blockwise weight gradient over the padded grouped layout | FP8 blockwise | gemm/grouped_scaled_wgrad's reference |
| ``wgrad`` | ``grouped_gemm_wgrad`` | grouped weight gradient, written or added into float32 ``main_grad`` | bf16 / fp16 | gemm/grouped_wgrad's reference |
| ``fp8_forward`` | - (the kernel ``blockwise`` launches; the producer ``tensor_scaled`` shares) | the FP8 blockwise forward / dgrad kernel, block scales per K step | FP8 blockwise | - |
| ``fp8_wgrad`` | - (the kernel ``blockwise_wgrad``, ``tensor_scaled_wgrad`` launch) | the FP8 grouped weight-gradient kernel, block scales or not | FP8 | - |
| ``pipeline`` | - | tile walk, ring, load / MMA steps, the forward epilogue, TMA store, layouts, the rows' entry calls (``grouped_call``, ``wgrad_call``), ``on_sm90`` | - | - |
"""

# The modules are the package's public names; the package itself defines nothing.
__all__ = [
    "blockwise", "blockwise_wgrad", "fp8_forward", "fp8_wgrad", "pipeline", "tensor_scaled",
    "tensor_scaled_wgrad", "wgrad",
]
