"""Activation offloading: tensors saved for backward wait in host memory.

``offload_activations`` (api.py) runs a ``Scheduler`` (scheduler.py: groups, what moves
and when; records.py: what it keeps per tensor, storage and group) behind torch's
saved-tensor hooks (hooks.py); copies go through a per-device link (link.py: streams
and events; streams.py: the current stream, looked up cheaply) into a reused host arena
(arena.py); ``mark_not_offload`` (marks.py) keeps chosen storages on the device. What
each group moves is decided without timings (plan.py), from stated rates and each
group's FLOPs (estimate.py), over whole storages (choice.py); the step's memory is
accounted, and its peak located, by peak.py.
"""

from fuseops.offload.api import ActivationOffload, link_budget, offload_activations
from fuseops.offload.arena import HostArena, host_arena
from fuseops.offload.marks import mark_not_offload
from fuseops.offload.records import Skip

__all__ = [
    "ActivationOffload", "HostArena", "Skip", "host_arena", "link_budget", "mark_not_offload",
    "offload_activations",
]
