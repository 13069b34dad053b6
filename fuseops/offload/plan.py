"""What each group of a step moves, decided from the model and the settings alone.

A group's default is a byte allowance: with ``"auto"`` what the link hides behind the
group's compute (estimate.py: stated rates, the FLOPs of its modules or the saved-bytes
rule), plus what the group before left of its own, at most one group's worth (its copies
may spill into the next group: the scheduler settles them one group later); the group
moves the whole storages that fill the allowance most (choice.py). An int is the
allowance, filled in save order; ``None`` moves everything.

A memory target (``peak_bytes_target``) then moves what it must: the step's account
(peak.py), as far as the step is known when a group is decided (its groups not yet
decided kept whole, the group saving now counted at least as large as the largest so
far), must peak under the target; where the group's default leaves it over, more of its
storages move (in save order), then storages earlier groups kept. When the backward
starts the whole account is known: storages kept so far move, earliest groups first,
until it holds. A target under the lowest peak that moving everything reaches raises a
``ValueError`` naming that peak as soon as the step shows it: a lower bound of it at a
group's start, a module call or a save; the exact one when the backward starts.
All of it is arithmetic on bytes and FLOPs: the same at every step that saves the
same tensors from the same ``base``, and in every process.
"""

from __future__ import annotations

from typing import Any

import torch

from fuseops.offload import peak as peak_model
from fuseops.offload.choice import fullest_subset
from fuseops.offload.estimate import Rates, held_sequentials, module_flops, rates_for, runs_its_children


class StepPlan:
    """The plan and the account of the step now running (one per ``offload_activations``).

    Args:
        budget: ``"auto"``, an int or ``None`` (``offload_activations``' ``group_budget_bytes``).
        keep_last: groups kept at the step's end.
        target: ``peak_bytes_target``, or ``None``.
        link_bytes_per_s: overrides the stated link bandwidth (estimate.py).
    """

    def __init__(self, *, budget: int | str | None, keep_last: int, target: int | None,
                 link_bytes_per_s: float | None) -> None:
        self.budget, self.keep_last, self.target = budget, keep_last, target
        self._link_bytes_per_s = link_bytes_per_s
        # Groups whose copies may still run when the next one after them is decided.
        self.lag = 1 if budget == "auto" and target is None else 0
        self.rates: Rates | None = None
        self.groups: list[Any] = []
        self.base = 0
        self.grads = 0
        # What the last decided group left of its allowance, at most its own hidden bytes.
        self.carry = 0
        self._params: set[int] = set()
        self._started = False
        self._unsaved_grads = 0
        # The fuseops Sequentials called in the step (``hidden``).
        self._called: set[int] = set()

    def begin(self) -> None:
        """A new step: nothing of it is known until its first group saves."""
        self.groups, self.grads, self.carry, self._params, self._started = [], 0, 0, set(), False
        self._unsaved_grads = 0
        self._called = set()

    def start_group(self, group: Any, device: torch.device) -> None:
        """``group`` is the step's next; the first one reads ``base`` and the rates."""
        if not self._started:
            self._started = True
            if self.rates is None:
                self.rates = rates_for(device, self._link_bytes_per_s)
            # The caching allocator's counter, read on the host: no device sync.
            self.base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        self.groups.append(group)
        if self._unsaved_grads:
            group.grads += self._unsaved_grads
            self._unsaved_grads = 0
        self.check_floor()

    def unsaved_grads(self, nbytes: int) -> None:
        """Weight gradients of modules called in a group that saved nothing that may move:
        counted with the step's last group (its backward runs next), or its first."""
        if self.groups:
            self.groups[-1].grads += nbytes
        else:
            self._unsaved_grads += nbytes

    def count_module(self, group: Any, module: torch.nn.Module, args: tuple) -> None:
        """A module called in ``group``: its FLOPs, and the bytes of the weight gradients of
        its parameters that have none yet (their backward allocates them)."""
        group.flops += module_flops(module, args)
        if runs_its_children(module):
            self._called.add(id(module))
        for child in held_sequentials(module):
            group.held_flops[id(child)] = module_flops(child, args)
        params = self._params
        for p in module.parameters(recurse=runs_its_children(module)):
            if p.requires_grad and p.grad is None and id(p) not in params:
                params.add(id(p))
                nbytes = p.numel() * p.element_size()
                group.grads += nbytes
                self.grads += nbytes
        self.check_floor()

    def allowance(self, group: Any) -> int | None:
        """Bytes ``group`` moves by default (``None``: all it saved)."""
        if self.budget == "auto":
            return self.hidden(group) + (self.carry if self.keep_last > 0 else 0)
        return self.budget

    def hidden(self, group: Any) -> int:
        """What the link hides behind ``group``'s compute (estimate.py): its modules' FLOPs,
        and with ``keep_last >= 1`` those of Sequentials its modules held and the step did
        not call by the time it is decided (with ``keep_last=0`` a group decides as it saves,
        before a call that comes later in it could tell)."""
        flops = group.flops
        if self.keep_last > 0:
            flops += sum(f for key, f in group.held_flops.items() if key not in self._called)
        return self.rates.hidden_bytes(flops, group.saved)

    def choose(self, sizes: list[int], allowance: int | None) -> list[int]:
        """Indices (into ``sizes``, the group's undecided storages in save order) that move
        by default."""
        if allowance is None:
            return list(range(len(sizes)))
        if self.budget == "auto":
            return list(fullest_subset(tuple(sizes), allowance))
        chosen, left = [], allowance
        for i, n in enumerate(sizes):
            if n <= left:
                chosen.append(i)
                left -= n
        return chosen

    def decided(self, group: Any, allowance: int | None) -> None:
        """``group`` was decided (keep_last >= 1): what it left of its allowance carries."""
        if self.budget == "auto" and allowance is not None:
            self.carry = min(max(0, allowance - group.moved), self.hidden(group))

    def over_target(self) -> bool:
        """Whether the step's account, as known now, peaks over the target: its decided
        groups as decided, the others kept whole, the group now saving counted at least as
        large as the largest so far."""
        if self.target is None:
            return False
        largest = self.largest()
        last = self.groups[-1] if self.groups else None
        groups = [peak_model.GroupBytes(max(g.saved, largest) if g is last else g.saved,
                                        g.moved if g.offloading else 0, g.grads) for g in self.groups]
        return peak_model.peak(self.base, groups, self.keep_last, self.lag).bytes > self.target

    def largest(self) -> int:
        return max((g.saved for g in self.groups), default=0)

    def lower_bound(self) -> int:
        """A lower bound of the lowest peak offloading reaches in this step, from what it
        has shown: the weight-gradient point so far, the groups in flight in the forward
        (``keep_last + 1 + lag`` of them, whole), and a backward's own group twice."""
        window = sum(g.saved for g in self.groups[-(self.keep_last + 1 + self.lag):])
        return self.base + max(self.grads, window, 2 * self.largest())

    def check_floor(self) -> None:
        """A ``ValueError`` as soon as the step shows the target under its lowest peak."""
        if self.target is None or not self._started:
            return
        lowest = self.lower_bound()
        if lowest > self.target:
            self._refuse(lowest, "at least ")

    def check_lowest(self) -> None:
        """The step's forward is over: a ``ValueError`` when even moving everything the
        step may move leaves its account over the target."""
        if self.target is None or not self.groups:
            return
        lowest = self.peak().lowest
        if lowest > self.target:
            self._refuse(lowest, "")

    def _refuse(self, lowest: int, qualifier: str) -> None:
        raise ValueError(
            f"peak_bytes_target: {self.target} bytes is below the lowest peak offloading can reach in this step, "
            f"{qualifier}{lowest} bytes ({self.base} allocated at the step's start, {self.grads} of weight "
            f"gradients, groups of up to {self.largest()} bytes saved, keep_last={self.keep_last}); expected a "
            f"target >= {lowest}")

    def peak(self) -> peak_model.Peak:
        groups = [peak_model.GroupBytes(g.saved, g.moved, g.grads) for g in self.groups]
        return peak_model.peak(self.base, groups, self.keep_last, self.lag)
