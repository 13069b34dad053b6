"""Mixture-of-experts, in one package: routing token rows to experts and back
(``routing.py``: ``permute`` / ``unpermute``, on the Triton kernels of
``fuseops/kernels/moe/``) and expert parallelism over ``torch.distributed``
(``expert_parallel.py``: ``dispatch`` / ``combine``). The expert MLP itself is a
``fuseops.Sequential`` of ``GroupedLinear`` / gated activation / ``GroupedLinear`` (fused by
``fuseops/fusions/grouped_mlp.py``); the transformers integration builds on this package.
"""

from fuseops.moe.expert_parallel import DispatchHandle, combine, dispatch
from fuseops.moe.routing import permute, unpermute

__all__ = ["DispatchHandle", "combine", "dispatch", "permute", "unpermute"]
