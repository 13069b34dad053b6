"""Whether torch differentiates the work being done now other than by our autograd Functions.

Under a torch.func transform (``maybe_current_level()`` is set) or inside a
``torch.autograd.forward_ad.dual_level`` block, tensors may be a transform's wrappers or carry
tangents: the references must run as plain torch ops (no ``out=``, no Triton kernel), which
``ops/executor/plain_autograd.py``, the grouped references and the MoE routing ask here.
``forward_ad._current_level`` is torch's private record of the open dual levels (no public
reader exists): read in this one place.
"""

from __future__ import annotations

from torch._C._functorch import maybe_current_level
from torch.autograd import forward_ad


def dual_level_active() -> bool:
    """Inside a ``forward_ad.dual_level`` block (forward-mode AD outside torch.func)."""
    return forward_ad._current_level >= 0


def differentiated_by_torch() -> bool:
    """Under a torch.func transform or inside a ``forward_ad.dual_level`` block."""
    return maybe_current_level() is not None or forward_ad._current_level >= 0
