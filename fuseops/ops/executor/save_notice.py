"""Saves announced as their tensors are produced, for whoever wants to act on them early.

The plan's Function saves every activation in one ``save_for_backward`` at the end of
its forward (``function.py``), so torch's saved-tensor hooks learn of a tensor only
then, even when an early op of the plan produced it: on a plan of GroupedLinear,
SwiGLU and GroupedLinear the experts' input is made at the start and saved at the end.
A receiver registered here (the offload scheduler, while an ``offload_activations``
context is active: ``fuseops/offload/hooks.py``) is handed, after each step of the
plan's forward, the activation tensors that step's records will save (exactly those
``pack_saved`` puts in ``save_for_backward``), so it may start moving them then. The
save itself still goes through the hooks as before; a notice is only a head start.

A fused step may notice sooner, inside its forward (``notice_early``): the MoE expert MLP
is one step (``fusions/grouped_mlp.py``), whose input is saved as it starts and whose
pre-activation is saved between its two GEMMs, so without that the step-end notice
would come where the save does. Such a notice reaches the receiver only while the
executor's forward runs with one on this thread (``noticing``).

The executor notices only where it will save: the ``PlanFunction`` form, not under
``torch.compile`` (nothing here is traced) nor under ``torch.func``, and never where no
backward is needed (the plan then runs without a Function). With no receiver the cost
is one global read per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from fuseops.ops.contract import OpContext
from fuseops.ops.executor.saved_state import activation_tensors

# Called with a step's to-be-saved activation tensors (a non-empty list).
Receiver = Callable[[list[torch.Tensor]], None]

_receiver: Receiver | None = None
# The receiver of the plan forward now running on this thread, if it notices.
_local = threading.local()


def set_receiver(receiver: Receiver | None) -> Receiver | None:
    """Make ``receiver`` the one the executor notifies (``None``: nobody); returns the
    previous one."""
    global _receiver
    previous, _receiver = _receiver, receiver
    return previous


def current_receiver() -> Receiver | None:
    """The receiver to notify now (``None``: nobody listens; nothing to gather)."""
    return _receiver


def noticing(receiver: Receiver | None) -> Receiver | None:
    """Make ``receiver`` the one ``notice_early`` reaches on this thread (the executor,
    around a forward that notices; ``None`` after it); returns the previous one."""
    previous = getattr(_local, "receiver", None)
    _local.receiver = receiver
    return previous


def notice_early(ctxs: Sequence[OpContext]) -> None:
    """A fused step's records set so far (``ctxs``), noticed before the step ends: their
    activations are made and will be saved as they are (a record changed afterwards is
    noticed again at the step's end, and the save checks versions)."""
    if torch.compiler.is_compiling():
        return
    receiver = getattr(_local, "receiver", None)
    if receiver is not None:
        tensors = activation_tensors(ctxs)
        if tensors:
            receiver(tensors)
