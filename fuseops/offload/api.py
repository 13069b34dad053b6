"""``fuseops.offload_activations``: keep the tensors saved for backward in host memory.

How much each group moves: a group's device-to-host copies run while the next group
computes its forward, and its host-to-device copies while the group after it computes
its backward (about twice as long). Both are hidden when a group moves at most
``bandwidth x forward time of one group``. Measured on the H100 machine, pinned copies
run at 53-55 GB/s each way, so each millisecond of forward hides ~54 MB: a transformer
layer (H=4096, 8k tokens, bf16) computes its forward in ~6-7 ms and saves about 1 GB,
so about a third of it moves for free and the rest is better left on the device. The
default, ``group_budget_bytes="auto"``, does this per group from the run's own timings
(planner.py); ``link_budget`` is the same arithmetic for a budget fixed by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fuseops.offload.hooks import Disabled, active
from fuseops.offload.planner import PINNED_BYTES_PER_S
from fuseops.offload.records import new_stats
from fuseops.offload.scheduler import Scheduler
from fuseops.offload.streams import refuse_capture


def link_budget(forward_seconds: float, *, bytes_per_s: float = PINNED_BYTES_PER_S, margin: float = 0.9) -> int:
    """The bytes a group may offload so the copies hide behind its neighbours' compute.

    Args:
        forward_seconds: forward time of one group (e.g. one layer), measured.
        bytes_per_s: host<->device bandwidth of pinned copies.
        margin: the fraction of the link to plan for (copies also share HBM bandwidth).
    """
    return int(forward_seconds * bytes_per_s * margin)


class ActivationOffload:
    """What ``offload_activations`` yields: ``group()`` and ``stats``."""

    def __init__(self, scope: Scheduler | Disabled) -> None:
        self._scope = scope

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Everything saved in this block is one group (nested groups join the outer one)."""
        if isinstance(self._scope, Disabled):
            yield
            return
        group = self._scope.open_group()
        try:
            yield
        finally:
            self._scope.close_group(group)

    @property
    def stats(self) -> dict[str, int]:
        """A snapshot: ``bytes_offloaded``, ``bytes_reloaded``, ``tensors_offloaded``,
        ``tensors_skipped`` and why (``skipped_<reason>``, see ``Skip``),
        ``storages_offloaded`` (copies made: views share one) and ``groups``; with
        ``group_budget_bytes="auto"``, what was planned and from what: ``groups_learning``
        (groups of steps still being measured: nothing moves), ``groups_planned``,
        ``planned_bytes`` (the budgets the plan gave them) and ``planned_bytes_per_s`` (the
        link rate the plan counts on: the measured pinned-copy bandwidth times its calibrated
        efficiency)."""
        return dict(self._scope.stats)


def _check_budget(budget: object) -> None:
    expected = 'expected "auto", None or an int >= 0'
    if isinstance(budget, str):
        if budget != "auto":
            raise ValueError(f"group_budget_bytes: {expected}, got {budget!r}")
    elif budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise TypeError(f"group_budget_bytes: {expected}, got {budget!r} ({type(budget).__name__})")
        if budget < 0:
            raise ValueError(f"group_budget_bytes: {expected}, got {budget!r}")


@contextlib.contextmanager
def offload_activations(
    *,
    keep_last: int = 1,
    min_tensor_bytes: int = 2**18,
    enabled: bool = True,
    group_budget_bytes: int | str | None = "auto",
) -> Iterator[ActivationOffload]:
    """Offload the tensors saved for backward inside this block to host memory.

    Args:
        keep_last: the last ``keep_last`` groups stay on the device (their backward
            comes first); ``0`` copies every tensor as soon as it is saved.
        min_tensor_bytes: storages smaller than this stay on the device.
        enabled: ``False`` keeps everything saved inside this block on the device, also
            inside an enclosing ``offload_activations``.
        group_budget_bytes: ``"auto"`` (the default): the groups move what the link
            hides behind compute, planned as one queue of copies (a group's copies run
            behind the forward of the group ``keep_last`` later and may spill into the
            next; what a group leaves on the link, later ones use) at 0.95 of the
            bandwidth, each reload within 0.9 of the next group's backward (a quarter
            behind the first backward group, whose prefetch waits past its peak; see
            planner.py), times the share of the bandwidth that planned steps achieved
            (where compute waited on the link for > 1% of a step, the plan shrinks; the
            first such cut is tried again once, after three steps that waited on nothing),
            from forward and backward
            times measured per group (CUDA events, read once passed: no host sync in a
            step) and the measured bandwidth of the link's own copies. The first two
            steps of a layout (group count and bytes per group) move nothing while they
            measure (``stats["skipped_learning"]``), and so peak as without offloading
            (a step counts once its events have passed: a loop that never synchronises,
            not even to read its loss, plans only steps later);
            a change of shapes or layers is learned again. An int: at most this many
            bytes leave the device per group, in save order; the rest stays (counted in
            ``stats["skipped_budget"]``); ``link_budget`` computes one by hand. ``None``:
            everything moves, from the first step (bound by the link when it saves more
            than it computes: ~54 MB per ms of compute on the H100 machine).

    Groups are each top-level ``fuseops.Sequential`` call and each ``offload.group()``
    block; tensors saved between groups form a group of their own. Backward may run
    inside or after the block. Gradients are bit-for-bit those without offloading.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected True or False, got {enabled!r}")
    if not isinstance(keep_last, int) or keep_last < 0:
        raise ValueError(f"keep_last: expected an int >= 0, got {keep_last!r}")
    if not isinstance(min_tensor_bytes, int) or min_tensor_bytes < 0:
        raise ValueError(f"min_tensor_bytes: expected an int >= 0, got {min_tensor_bytes!r}")
    _check_budget(group_budget_bytes)
    if enabled:
        if torch.cuda.is_available():
            refuse_capture()
        scope: Scheduler | Disabled = Scheduler(
            keep_last=keep_last, min_tensor_bytes=min_tensor_bytes, group_budget_bytes=group_budget_bytes
        )
    else:
        scope = Disabled(new_stats())
    with active(scope):
        try:
            yield ActivationOffload(scope)
        finally:
            if isinstance(scope, Scheduler):
                scope.finish()
