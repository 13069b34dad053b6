"""MoE routing kernels (``fuseops.moe.routing`` runs them). Triton, any CUDA GPU and the
interpreter; rows float32, float16 or bfloat16; expert ids int32 / int64; no host sync.

| module | launchers | computes | reference |
| --- | --- | --- | --- |
| ``permute`` | ``permute`` | token rows grouped by expert: ``x_sorted`` [T*K, H], split sizes [E], ``row_map`` [T, K] | ``reference_permute`` |
| ``permute`` | ``unpermute``, ``unpermute_bwd`` | the weighted top-k combine back per token, and its gradients for rows and weights | ``reference_unpermute``, ``reference_unpermute_bwd`` |
| ``traceable`` | ``permute``, ``unpermute``, ``unpermute_bwd`` | the same, as ``torch.library`` custom ops while ``torch.compile`` traces | the launchers' |
"""

# The modules are the package's public names; the package itself defines nothing.
__all__ = [
    "permute", "traceable",
]
