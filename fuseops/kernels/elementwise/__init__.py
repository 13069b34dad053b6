"""Elementwise and row-wise kernels: activations, norms, bias gradients, and their variants
whose output leaves the kernel quantized for the next GEMM. Triton, any CUDA GPU and the
interpreter; one kernel for float32, float16 and bfloat16 (fp32 compute); row reductions
deterministic (partials then a fixed-order sum, ``bias_grad.sum_partials``).

| module | launchers | computes | formats | reference |
| --- | --- | --- | --- | --- |
| ``activation_math`` | (jit helpers) | ReLU, GELU (erf / tanh), SiLU, SReLU, Sigmoid and the gated forms, value and derivative | - | ``reference_activation``, ``reference_gated`` |
| ``activation`` | ``activation_fwd``, ``activation_bwd``, ``activation_bwd_dbias`` | ``act(x)``, ``dy * act'(x)``, with ``dbias`` | fp32/fp16/bf16 | ``reference_activation_*`` |
| ``gated_activation`` | ``gated_fwd``, ``gated_bwd`` | ``act(a) * b [* probs]`` (halves or interleaved, clamped), grads and ``dprobs`` | fp32/fp16/bf16 | ``reference_gated_*`` |
| ``bias_grad`` | ``bias_grad`` | ``db = dy.sum(0)``; the shared row reduction | fp32/fp16/bf16 | ``reference_bias_grad`` |
| ``norm`` | ``layernorm_fwd/bwd``, ``rmsnorm_fwd/bwd`` | LayerNorm / RMSNorm (zero-centred gamma) and grads | fp32/fp16/bf16 | ``reference_*norm_*`` |
| ``activation_quantize`` | ``activation_quantize_fwd``, ``gated_quantize_fwd`` | an activation whose output is the next GEMM's quantized input | all four recipes | ``reference_*_quantize_fwd`` |
| ``norm_quantize`` | ``layernorm_quantize_fwd``, ``rmsnorm_quantize_fwd`` | a norm whose output is the next GEMM's quantized input | all four recipes | ``reference_*_quantize_fwd`` |
"""

# The modules are the package's public names; the package itself defines nothing.
__all__ = [
    "activation", "activation_math", "activation_quantize", "bias_grad", "gated_activation", "norm",
    "norm_quantize",
]
