"""``fuseops.offload_activations``: keep the tensors saved for backward in host memory.

How much each group moves: a group's device-to-host copies run while the next group
computes its forward, and its host-to-device copies while the group after it computes
its backward (about twice as long). Both are hidden when a group moves at most
``bandwidth x forward time of one group``: at 54 GB/s, each millisecond of forward hides
~54 MB. The default, ``group_budget_bytes="auto"``, counts that per group from stated
rates and the group's FLOPs (estimate.py, plan.py), never from the run's clocks, so it
holds from the first step and in every process; ``link_budget`` is the same arithmetic
for a budget fixed by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fuseops.offload.estimate import LINK_BYTES_PER_S
from fuseops.offload.hooks import Disabled, active
from fuseops.offload.records import new_stats
from fuseops.offload.scheduler import Scheduler
from fuseops.offload.streams import refuse_capture


def link_budget(forward_seconds: float, *, bytes_per_s: float = LINK_BYTES_PER_S["H100"], margin: float = 0.9) -> int:
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
    def stats(self) -> dict[str, int | str]:
        """A snapshot: ``bytes_offloaded``, ``bytes_reloaded``, ``tensors_offloaded``,
        ``tensors_skipped`` and why (``skipped_<reason>``, see ``Skip``),
        ``storages_offloaded`` (copies made: views share one) and ``groups``; with
        ``group_budget_bytes="auto"``, what was planned and from what: ``groups_planned``,
        ``planned_bytes`` (the allowances the plan gave them), ``planned_bytes_per_s`` and
        ``planned_flops_per_s`` (the stated rates it counted with); ``bytes_for_target``
        (bytes moved beyond the default for ``peak_bytes_target``); and the last step's
        accounted peak (``peak_bytes``, ``peak_where``: ``"forward of group i"``,
        ``"backward of group i"`` or ``"weight gradients"``, ``peak_lowest_bytes``: the
        same with everything movable moved, and ``peak_offload_can_lower``: the
        difference)."""
        stats = dict(self._scope.stats)
        if isinstance(self._scope, Scheduler):
            stats.update(self._scope.peak_stats())
        return stats


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


def _check_target(target: object) -> None:
    if target is not None and (isinstance(target, bool) or not isinstance(target, int)):
        raise TypeError(f"peak_bytes_target: expected None or an int > 0, got {target!r} ({type(target).__name__})")
    if target is not None and target <= 0:
        raise ValueError(f"peak_bytes_target: expected None or an int > 0, got {target!r}")


def _check_link(rate: object) -> None:
    if rate is None:
        return
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise TypeError(f"link_bytes_per_s: expected None or a number > 0, got {rate!r} ({type(rate).__name__})")
    if not rate > 0 or rate == float("inf"):
        raise ValueError(f"link_bytes_per_s: expected None or a finite number > 0, got {rate!r}")


@contextlib.contextmanager
def offload_activations(
    *,
    keep_last: int = 1,
    min_tensor_bytes: int = 2**18,
    enabled: bool = True,
    group_budget_bytes: int | str | None = "auto",
    peak_bytes_target: int | None = None,
    link_bytes_per_s: float | None = None,
) -> Iterator[ActivationOffload]:
    """Offload the tensors saved for backward inside this block to host memory.

    What stays on the device is decided from the model, its shapes and these settings
    alone (no timings): the same from the first step, and in every process.

    Args:
        keep_last: the last ``keep_last`` groups stay on the device (their backward
            comes first); ``0`` decides every tensor as it is saved.
        min_tensor_bytes: storages smaller than this stay on the device.
        enabled: ``False`` keeps everything saved inside this block on the device, also
            inside an enclosing ``offload_activations``.
        group_budget_bytes: ``"auto"`` (the default): each group moves the whole
            storages that best fill what the link hides behind its compute: its modules'
            forward FLOPs (``torch.nn.Linear``, a ``fuseops.Sequential``'s ``Linear`` and
            ``GroupedLinear``; where none runs, 1024 FLOPs per byte it saves) at the device kind's
            stated FLOP rate, times the link's stated bandwidth (54 GB/s on H100 / H200)
            and 0.9, plus what the group before it left unused (at most its own share).
            An int: at most this many bytes leave the device per group, in save order;
            the rest stays (``stats["skipped_budget"]``); ``link_budget`` computes one by
            hand. ``None``: everything moves (bound by the link when a group saves more
            than its compute hides).
        peak_bytes_target: keep the step's accounted peak (peak.py: the bytes allocated
            at the step's start, the weight gradients to come, the saved bytes held, and a
            backward's working memory) under this many bytes, from the first step: each
            group moves its ``group_budget_bytes`` share, then what the target needs
            (``stats["bytes_for_target"]``). A target below the lowest peak offloading
            reaches raises a ``ValueError`` naming it, as soon as the step shows it (a
            group's start, a module call or a save; at the latest as the backward starts).
        link_bytes_per_s: the host link's bandwidth to plan with, instead of the stated
            one for the device kind.

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
    _check_target(peak_bytes_target)
    _check_link(link_bytes_per_s)
    if enabled:
        if torch.cuda.is_available():
            refuse_capture()
        scope: Scheduler | Disabled = Scheduler(
            keep_last=keep_last, min_tensor_bytes=min_tensor_bytes, group_budget_bytes=group_budget_bytes,
            peak_bytes_target=peak_bytes_target, link_bytes_per_s=link_bytes_per_s,
        )
    else:
        scope = Disabled(new_stats())
    with active(scope):
        try:
            yield ActivationOffload(scope)
        finally:
            if isinstance(scope, Scheduler):
                scope.finish()
