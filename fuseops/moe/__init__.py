"""Mixture-of-experts, in one package: routing token rows to experts and back
(``routing.py``: ``permute`` / ``unpermute``, on the Triton kernels of
``fuseops/kernels/moe/``) and expert parallelism over ``torch.distributed``
(``expert_parallel.py``: ``dispatch`` / ``combine``). The expert MLP itself is a
``fuseops.Sequential`` of ``GroupedLinear`` / gated activation / ``GroupedLinear`` (fused by
``fuseops/fusions/grouped_mlp.py``); ``expert_layer.py`` runs routing, that MLP and the
combine as one autograd Function that keeps less for the backward (``memory_model.py``
accounts for it). The transformers integration builds on this package.
"""

from fuseops.exported_names import exported_dir
from fuseops.moe.capacity_exchange import CapacityHandle, Overflow
from fuseops.moe.exact_exchange import DispatchHandle, ExactChunksHandle
from fuseops.moe.expert_layer import expert_layer, expert_layer_fallback
from fuseops.moe.expert_parallel import (
    combine,
    dispatch,
    dispatch_chunks,
    expert_capacity,
    expert_state_dict_for_rank,
    gather_expert_state_dicts,
)
from fuseops.moe.routing import permute, unpermute

__all__ = [
    "CapacityHandle", "DispatchHandle", "ExactChunksHandle", "Overflow", "combine", "dispatch", "dispatch_chunks",
    "expert_capacity", "expert_layer", "expert_layer_fallback", "expert_state_dict_for_rank",
    "gather_expert_state_dicts", "permute", "unpermute",
]


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
