"""Activation offloading: tensors saved for backward wait in host memory.

``offload_activations`` (api.py) runs a ``Scheduler`` (scheduler.py: groups, what moves
and when; records.py: what it keeps per tensor, storage and group) behind torch's
saved-tensor hooks (hooks.py); copies go through a per-device link (link.py: streams
and events; streams.py: the current stream, looked up cheaply) into a reused host arena (arena.py); ``mark_not_offload`` (marks.py) keeps
chosen storages on the device. With ``group_budget_bytes="auto"`` (the default) a
per-device planner (planner.py) sets each group's budget from step timings that the
scheduler marks and a timer (timing.py: CUDA events, or the host clock) reads once passed:
the step's copies planned as one queue (queue_plan.py), over each group's storages
(choice.py: which whole storages fill a budget), each group copying as it saves once
the layout is known (early.py).
"""

from fuseops.offload.api import ActivationOffload, link_budget, offload_activations
from fuseops.offload.arena import HostArena, host_arena
from fuseops.offload.marks import mark_not_offload
from fuseops.offload.records import Skip

__all__ = [
    "ActivationOffload", "HostArena", "Skip", "host_arena", "link_budget", "mark_not_offload",
    "offload_activations",
]
