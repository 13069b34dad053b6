"""fuseops: PyTorch models composed from basic ops, fused by a planner into Triton kernels."""

from fuseops import distributed, integrations, moe, ops
from fuseops.offload import mark_not_offload, offload_activations
from fuseops.quant import recipes, weight_cache
from fuseops.quant.autocast import autocast
from fuseops.quant.quantize import quantize
from fuseops.sequential import Sequential

__all__ = [
    "Sequential",
    "autocast",
    "distributed",
    "integrations",
    "mark_not_offload",
    "moe",
    "offload_activations",
    "ops",
    "quantize",
    "recipes",
    "weight_cache",
]
