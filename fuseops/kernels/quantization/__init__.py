"""Quantization: the number formats and the kernels that produce them. Triton, any CUDA GPU
and the interpreter; inputs float32, float16 or bfloat16.

| module | launchers | computes | formats | reference |
| --- | --- | --- | --- | --- |
| ``formats`` | (codecs, scale rules) | E4M3 / E5M2 / E8M0 / E2M1 codecs, block scales, the padded grouped layout | all | ``reference_quantize``, ``reference_dequantize`` |
| ``operand`` | - | ``Operand``: a GEMM operand quantized along K, as the scaled GEMMs read it | all | - |
| ``amax`` | ``amax``, ``row_amax``, ``tensor_scales`` | per-tensor (or per-group) amax, each row's amax, and scales on device: no host sync | FP8 current scaling, NVFP4 | ``reference_amax``, ``reference_row_amax``, ``reference_tensor_scales`` |
| ``quantize`` | ``quantize`` | one cast pass writing the row-wise and column-wise copies and their scales | all four recipes | ``reference_quantize`` |
| ``tiles`` | (jit helpers) | the cast's tile layout, block scales and stores | - | - |
| ``epilogue`` | (jit helpers) | the producers' quantize epilogue (norms, activations, FC1) | all four recipes | ``reference_quantize`` |
"""

# The modules are the package's public names; the package itself defines nothing.
__all__ = [
    "amax", "epilogue", "finite", "formats", "operand", "quantize", "tiles",
]
