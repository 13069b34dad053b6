"""Warp-specialized Gluon GEMMs for Hopper (sm_90 only; never under the interpreter): a TMA
producer warp fills a ring of shared-memory stages, two consumer warpgroups run the wgmma
of each tile's two halves. The dispatch table routes calls here when ``serves*`` holds
(TMA-ready operands, the format); elsewhere gemm/'s Triton kernels run.

| module | launcher (dispatch row) | computes | formats | reference |
| --- | --- | --- | --- | --- |
| ``blockwise`` | ``gemm_scaled``, ``grouped_gemm_scaled`` | dense / grouped FP8 GEMM, 1x128 and 128x128 scales rescaled per 128-long K step | FP8 blockwise | gemm/dense_scaled's / grouped_scaled's references |
| ``tensor_scaled`` | ``grouped_gemm_scaled`` | grouped FP8 GEMM (forward, dgrad), one scale per group and operand applied to the result; bf16 / fp16 out | FP8 current scaling | gemm/grouped_scaled's reference |
| ``tensor_scaled_pingpong`` | ``grouped_gemm_scaled`` (not routed until timed against ``tensor_scaled``) | the same, each consumer on alternate whole tiles | FP8 current scaling | gemm/grouped_scaled's reference |
| ``tensor_scaled_wgrad`` | ``grouped_gemm_scaled_wgrad`` (not routed until timed: ``benchmarks/fp8_gemm_tiles.py``) | grouped FP8 weight gradient, the groups' two scales applied to the result, written in bf16 / fp16 or added to float32 ``main_grad`` | FP8 current scaling | gemm/grouped_scaled_wgrad's reference |
| ``blockwise_wgrad`` | ``grouped_gemm_scaled_wgrad`` | grouped FP8 blockwise weight gradient over the padded grouped layout | FP8 blockwise | gemm/grouped_scaled_wgrad's reference |
| ``wgrad`` | ``grouped_gemm_wgrad`` | grouped weight gradient, written or added into float32 ``main_grad`` | bf16 / fp16 | gemm/grouped_wgrad's reference |
| ``fp8_forward`` | - (the kernel ``blockwise``, ``tensor_scaled`` launch) | the FP8 forward / dgrad kernel, block scales per K step or not (``BLOCK_SCALES``) | FP8 | - |
| ``fp8_wgrad`` | - (the kernel ``blockwise_wgrad``, ``tensor_scaled_wgrad`` launch) | the FP8 grouped weight-gradient kernel, block scales or not | FP8 | - |
| ``pipeline`` | - | tile walk, ring, load / MMA steps, the forward epilogue, TMA store, layouts, the rows' entry calls (``grouped_call``, ``wgrad_call``), ``on_sm90`` | - | - |
"""
