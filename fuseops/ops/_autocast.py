"""``torch.autocast`` inside the ops: the policy torch applies to each op's counterpart.

The plan runs with torch's autocast switched off and hands each op the autocast dtype in
``OpContext.autocast`` (``TensorSpec.autocast`` for ``check``), so forward, backward, the
torch references and the Triton kernels all see the same explicit casts:

- matmul-class ops (Linear, GroupedLinear, every fused GEMM) compute in the autocast dtype:
  the input is cast per call, as torch does; a parameter is cast through
  ``fuseops.quant.weight_cache.derived``, so once per weight version (torch caches its casts
  of leaf parameters too);
- norms follow torch's policy for ``layer_norm``/``rms_norm``: on CUDA LayerNorm returns
  float32 (CUDA autocast's float32 list) and RMSNorm the input's dtype (not on the list; the
  GPU test compares with torch); on CPU they take any float input with
  float32 parameters and return the input's dtype (CPU autocast leaves them alone, and the
  native kernels accept mixed dtypes), computing the statistics in float32 either way;
- elementwise ops run in their input's dtype; ``AddExtraInput`` promotes as ``x + r`` does;
  ``Bias`` adds its bias cast to the compute dtype, as the bias of ``torch.nn.Linear``.

Gradients go back in the dtype each tensor came in (the executor casts, as the gradient of
torch's cast does): parameters get float32 gradients from float32 parameters.
"""

from __future__ import annotations

import torch

from fuseops.quant.weight_cache import derived

# The dtypes torch's autocast casts ("eligible"): float64 is never touched.
ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype ``torch.autocast`` computes matmuls in on ``device`` now, or None."""
    try:
        if not torch.is_autocast_enabled(device.type):
            return None
        return torch.get_autocast_dtype(device.type)
    except RuntimeError:
        # A device type autocast does not know (meta, ...): nothing is cast.
        return None


def cast_input(dtype: torch.dtype | None, x: torch.Tensor) -> torch.Tensor:
    """``x`` in the autocast dtype (per call); anything else as it is."""
    if dtype is None or not isinstance(x, torch.Tensor) or x.dtype not in ELIGIBLE or x.dtype == dtype:
        return x
    return x.to(dtype)


def cast_param(dtype: torch.dtype | None, p: torch.Tensor | None) -> torch.Tensor | None:
    """Parameter ``p`` in the autocast dtype, cast once per weight version."""
    if dtype is None or p is None or p.dtype not in ELIGIBLE or p.dtype == dtype:
        return p
    return derived(p, ("autocast", dtype), lambda q: q.to(dtype))


# The norms on CUDA autocast's float32 list (``layer_norm`` is, ``rms_norm`` is not).
CUDA_FLOAT32_NORMS = frozenset({"LayerNorm"})


class AutocastParameters:
    """What a GEMM op (Linear, GroupedLinear) reads of its ``weight`` and ``bias``: under
    ``torch.autocast`` their casts (once per weight version), else themselves."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def compute_weight(self, ctx) -> torch.Tensor:
        return cast_param(ctx.autocast, self.weight)

    def compute_bias(self, ctx) -> torch.Tensor | None:
        return cast_param(ctx.autocast, self.bias)


def norm_output_dtype(dtype: torch.dtype | None, x_dtype: torch.dtype, device_type: str, norm: str) -> torch.dtype:
    """What norm ``norm`` (a class name) returns under autocast: float32 on CUDA for those on
    CUDA autocast's float32 list, the input's dtype otherwise."""
    if dtype is None or x_dtype not in ELIGIBLE:
        return x_dtype
    return torch.float32 if device_type == "cuda" and norm in CUDA_FLOAT32_NORMS else x_dtype
