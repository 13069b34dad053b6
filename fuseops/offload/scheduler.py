"""The offload scheduler: groups of saved tensors, what moves to the host, and when.

Every tensor saved for backward inside the context reaches ``pack`` (torch's
saved-tensor hooks; fuseops' fuser saves activations, one plain buffer at a time,
through the same door). fuseops' plan Function saves all its activations as its
forward ends, so the executor also hands each to ``notice`` as soon as it is made
(``ops/executor/save_notice.py``; hooks.py passes it on, notice.py takes it): its
record is made there, as a save would make it, so its copy may start then, and the
save that follows finds it by storage and version (one changed in place in between is
saved afresh; one whose save never comes is dropped as its group ends, ``_abandon``).
What is kept where it is, and why, is decided in ``pack``: parameters and their views,
other leaves that require grad, module buffers, marked storages, small storages and
tensors that are not plain strided CPU/CUDA tensors.
Everything else becomes a ``SavedTensor`` handle on a ``Stored`` record (records.py),
one per storage (at one version): views share their storage's record and are rebuilt
with their exact size, stride and offset. A group that can move nothing (an int budget
under ``min_tensor_bytes``, or an "auto" step that is learning) skips all of that: its
tensors pass through in a ``Passed`` handle that only marks the group's backward, so
that offloading costs the host next to nothing where nothing moves. So does a storage
larger than any budget its group can have (``_cap``: the int budget, or the budget
"auto" last planned for the group's place, which grows only back to a budget planned
before): it could not move in this step, and a record would only cost the host; its
bytes still count where the backward's prefetches measure room (``_resident_bytes``).

Groups follow the forward in order. A group is offloaded once ``keep_last`` later
groups exist (so the last ``keep_last`` stay on the device; with ``keep_last=0`` each
tensor is copied as it is saved), after the fence its producer recorded when the group
closed; with ``"auto"`` and a layout the planner knows, a group that is not among the
profile's last ``keep_last`` copies each tensor as it is saved instead (early.py). A
byte budget per group keeps what the link could not hide: a fixed int (what fits of it
moves, in save order), or with ``"auto"`` the sum of the storages the
step's plan chose for the group (planner.py, from the run's own timings and each
group's storage sizes: the scheduler records the marks and the sizes, the planner reads
them), which the fullest subset under it moves exactly (choice.py). The sources
of those copies are released when the next group starts (the compute stream waits for
the copies there, the host never does), so a copy has one group of compute to finish
in (with "auto", when the group after it starts: the planner queues copies that may
spill into the next group's compute); or sooner, at any later save, once the copy has passed (a non-blocking query): a
group in flight stays on the device only as long as its copies run. In backward, the first unpack of a group reloads it if its
prefetch did not, and arms the prefetch of the previous group on the host, one group
ahead (backward.py; ``_start_backward`` says when it fires).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fuseops.offload.backward import BackwardPath
from fuseops.offload.choice import fullest_subset
from fuseops.offload.early import early_plan
from fuseops.offload.link import link_for, whole_storage
from fuseops.offload.marks import StorageSet, is_marked
from fuseops.offload.notice import NoticePath
from fuseops.offload.planner import Planner, StepLog, planner_for
from fuseops.offload.queue_plan import SETTLE_LAG
from fuseops.offload.records import Group, Passed, SavedTensor, Skip, Stored, Where, count_skip, new_stats
from fuseops.offload.streams import refuse_capture


def _fullest_first(records: list[Stored], budget: int) -> list[Stored]:
    """``records`` reordered so that taking them in order while they fit moves the subset
    that fills ``budget`` the most (choice.py), then the rest in save order: a planned
    budget is the sum of the storages the step's plan chose for the group, and this
    moves exactly that sum (64, 64, 256, 256 MB into 384 MB: 256 + 64 + 64)."""
    chosen = fullest_subset(tuple(s.nbytes for s in records), budget)
    picked = set(chosen)
    return [records[i] for i in chosen] + [s for i, s in enumerate(records) if i not in picked]


class Scheduler(NoticePath, BackwardPath):
    """Offload state of one ``offload_activations`` context (see the module docstring; its
    save notices are ``NoticePath`` in notice.py, its backward half, unpack, reloads and
    prefetches, ``BackwardPath`` in backward.py)."""

    def __init__(self, *, keep_last: int, min_tensor_bytes: int, group_budget_bytes: int | str | None) -> None:
        self.keep_last = keep_last
        self.min_tensor_bytes = min_tensor_bytes
        self._min_bytes = max(min_tensor_bytes, 1)
        self.group_budget_bytes = group_budget_bytes
        self.stats = new_stats()
        self.buffers = StorageSet()
        self._groups: list[Group] = []
        self._current: Group | None = None
        self._current_explicit = False
        self._on_host: set[int] = set()
        # Records by storage (``_cdata``): the weak reference its group holds too (one
        # object per record; a dead entry is replaced by the next record at that address).
        self._by_storage: dict[int, weakref.ref[Stored]] = {}
        # Groups that can move nothing take a cheap path (``Passed``): an int budget below
        # the smallest storage that may move, or an "auto" step that is learning.
        self._cannot_move = isinstance(group_budget_bytes, int) and group_budget_bytes < max(min_tensor_bytes, 1)
        # Copies out not yet settled: (group current when issued, device, event, records,
        # the planned step's log the wait is reported to, or None).
        self._unsettled: list[tuple[int, torch.device, Any, list[Stored], StepLog | None]] = []
        # Every device copies out were issued on (``_release_copied``: when all are behind).
        self._copy_devices: set[torch.device] = set()
        # Groups opened by the fuseops.Sequential calls now running (None: nested call).
        self.sequential_groups: list[Group | None] = []
        # group_budget_bytes="auto": the planner of the first device seen, the step now
        # running and its groups in forward order.
        self._planner: Planner | None = None
        self._log: StepLog | None = None
        self._step_groups: list[Group] = []
        # Copies issued while group i was current are settled when group i + 1 + lag
        # starts: "auto" plans a queue that may spill one group (planner.py); a group
        # copied early (early.py) counts as issued when group index + keep_last starts.
        self._settle_lag = SETTLE_LAG if group_budget_bytes == "auto" else 0
        # Saved bytes on the device when the forward ended (what backward's prefetches
        # may fill back up to), and whether a group's backward has started.
        self._resident_at_forward_end: int | None = None
        self._backward_seen = False
        # Saved bytes held on the device in host order (records kept, and sources of
        # copies the host has not yet seen pass), and their peak over the forward: what
        # later groups' prefetches may fill back up to (see ``_start_backward``).
        self._held = 0
        self._forward_peak = 0
        # Storages passed through for being over their group's cap, this forward: a later
        # group that saves one again passes it too (as a record would stay where its first
        # group decided it).
        self._over_cap: dict[int, StorageWeakRef] = {}
        # Records made by a notice (``notice``) whose save has not come yet, by storage,
        # with the tensor noticed: held here until it comes (its handle holds the record
        # from then on), or until the group ends or backward starts without it (``_abandon``).
        self._noticed: dict[int, tuple[torch.Tensor, Stored]] = {}

    def open_group(self) -> Group | None:
        """Start a group; ``None`` when one is already open (groups do not nest)."""
        if self._current_explicit:
            return None
        self._close_current()
        self._current, self._current_explicit = Group(), True
        return self._current

    def close_group(self, group: Group | None) -> None:
        if group is not None and group is self._current:
            self._close_current()

    def _close_current(self) -> None:
        if self._noticed:
            self._abandon_noticed()
        group, self._current, self._current_explicit = self._current, None, False
        if group is not None and group.index >= 0:
            group.fences = {d: link_for(d).fence() for d in group.devices}

    def finish(self) -> None:
        """The context ends: groups not offloaded by now are the last ``keep_last``."""
        self._close_current()
        self._end_forward()
        for group in self._groups:
            if not group.offloading:
                self._keep(group)
        self._settle(len(self._groups))

    def _group_for_save(self, device: torch.device) -> Group:
        if device.type == "cuda":
            refuse_capture()
        group = self._current
        if group is None:
            # Tensors saved between groups form a group of their own, ended by the next.
            group = self._current = Group()
        if group.index < 0:
            # A forward after a backward (a second step in the same context) starts afresh.
            if self._backward_seen:
                for old in self._groups:
                    old.over_cap.clear()
                self._over_cap.clear()
                self._held, self._forward_peak = self._resident_bytes(), 0
            self._backward_seen = False
            group.index = len(self._groups)
            if self.group_budget_bytes == "auto":
                self._mark_forward(group, device)
                group.passthrough = group.learning = self._log.learning
                self.stats["groups_learning"] += group.learning
            else:
                group.budget_left = self.group_budget_bytes
                group.passthrough = self._cannot_move
            self._groups.append(group)
            self.stats["groups"] += 1
            # Copies issued before the last (1 + lag) groups had their compute to finish in.
            # With "auto", the group's start mark is where compute waits for them: nothing
            # was queued between the two.
            self._settle(group.index - self._settle_lag, at=group.log.forward[-1] if group.log is not None else None)
            older = group.index - self.keep_last
            if older >= 0:
                self._offload_group(self._groups[older])
            if self.keep_last > 0 and group.log is not None and not group.learning:
                self._start_early(group)
        return group

    def _start_early(self, group: Group) -> None:
        """With a layout the planner knows, ``group`` moves as it saves (early.py)."""
        layout = [g.eligible for g in self._step_groups[: group.position]]
        plan = early_plan(self._planner, group.log, group.position, layout)
        if plan is not None:
            group.offloading = True
            group.budget_left, group.picks = plan
            self._count_planned(plan[0])

    def _mark_forward(self, group: Group, device: torch.device) -> None:
        """Record the start of ``group``'s forward in the step's log (a new step once the
        last one's forward has ended); read what earlier steps' marks have passed."""
        if self._planner is None:
            self._planner = planner_for(device)
        if self._log is None or self._log.forward_end is not None:
            self._log, self._step_groups = self._planner.begin_step(self.keep_last), []
        else:
            self._planner.poll()
        group.log, group.position = self._log, len(self._step_groups)
        self._step_groups.append(group)
        self._log.forward.append(self._planner.timer.mark())

    def _end_forward(self) -> None:
        """The step's forward is over (its context ends, or its backward starts)."""
        if self._log is not None and self._log.forward_end is None:
            self._log.forward_end = self._planner.timer.mark()
            self._log.layout = [g.eligible for g in self._step_groups]
            self._log.sizes = [tuple(g.sizes.values()) for g in self._step_groups]
            self._log.saves = [g.saves for g in self._step_groups]

    def _resident_bytes(self) -> int:
        """Saved bytes on the device now: records neither on the host nor consumed by
        backward (a consumed one is freed once its node has run)."""
        # Every record of the step, at each backward group's start: walked in place, no
        # list of live records built per group.
        total = 0
        for g in self._groups:
            for ref in g.records:
                s = ref()
                if s is not None and s.group is g and s.where is not Where.HOST and not s.consumed:
                    total += s.nbytes
            if g.over_cap:
                total += sum(g.over_cap.values())
        return total

    def _cap(self, group: Group) -> int | None:
        """The most bytes one storage of ``group`` may have and still move (``None``: no
        bound known): an int budget, or what "auto" last planned for the group's place
        (see planner.py for when it changes)."""
        if isinstance(self.group_budget_bytes, int):
            return self.group_budget_bytes
        if group.log is not None and not group.learning:
            return self._planner.planned.get(group.position)
        return None

    def _plan(self, group: Group) -> None:
        """``group``'s budget from the planner (``"auto"``), as it starts moving."""
        # Its own bytes are known once it has ended (not with keep_last=0).
        known = group.position + (1 if self.keep_last > 0 else 0)
        layout = [g.eligible for g in self._step_groups[:known]] if group.log is self._log else group.log.layout[:known]
        budget = self._planner.budget(group.log, group.position, layout)
        group.learning = budget is None
        group.budget_left = 0 if budget is None else budget
        if budget is None:
            self.stats["groups_learning"] += 1
        else:
            self._count_planned(budget)

    def _count_planned(self, budget: int) -> None:
        """What the plan gave a group and the link rate it counted on: the user's view of
        "auto" (``ActivationOffload.stats``)."""
        self.stats["groups_planned"] += 1
        self.stats["planned_bytes"] += budget
        self.stats["planned_bytes_per_s"] = int(self._planner.achieved_bytes_per_s())

    def _skip_reason(self, t: torch.Tensor) -> Skip | torch.UntypedStorage:
        """Why ``t`` stays where it is, or its storage when it may move (read once here:
        every saved tensor comes through, and each storage call is a call into torch)."""
        # Exact type first: ``isinstance(t, Parameter)`` runs a Python metaclass check,
        # the most expensive line here, and a plain tensor is never a parameter.
        kind = type(t)
        if kind is not torch.Tensor:
            return Skip.PARAMETER if isinstance(t, torch.nn.Parameter) else Skip.UNSUPPORTED
        base = t._base
        if base is not None:
            if type(base) is not torch.Tensor and isinstance(base, torch.nn.Parameter):
                return Skip.PARAMETER
        else:
            base = t
        if base.requires_grad and base.is_leaf:
            return Skip.LEAF
        # ``is_cpu`` / ``is_cuda``: ``t.device`` builds a device object per saved tensor.
        if (not (t.is_cuda or t.is_cpu) or t.layout is not torch.strided or t.is_quantized
                or t.is_nested or t.is_conj() or t.is_neg()):
            return Skip.UNSUPPORTED
        storage = t.untyped_storage()
        if storage in self.buffers:
            return Skip.BUFFER
        if is_marked(storage):
            return Skip.MARKED
        if storage.nbytes() < self._min_bytes:
            return Skip.SMALL
        return storage

    def pack(self, t: torch.Tensor) -> Any:
        if t.is_cuda:
            refuse_capture()
        if self._noticed:
            handle = self._pack_noticed(t)
            if handle is not None:
                return handle
        storage = self._skip_reason(t)
        if type(storage) is Skip:
            count_skip(self.stats, storage)
            return t
        group = self._saving_group(t)
        key, nbytes = storage._cdata, storage.nbytes()
        # The layout the planner compares steps by: bytes of every eligible save, counted
        # the same whether the group keeps records or passes its tensors through.
        group.eligible += nbytes
        index = self._first_save(group, key, nbytes)
        if group.passthrough:
            return self._pass(group, t)
        ref = self._by_storage.get(key)
        stored = ref() if ref is not None else None
        if stored is not None and (stored.ref.expired() or stored.version != t._version):
            stored = None
        if self._noticed:
            noticed = self._noticed.pop(key, (None, None))[1]
            if noticed is not None and noticed is not stored:
                # Changed in place since its notice: the record (and any copy it started)
                # holds the old value; this save is recorded afresh below.
                self._abandon(key, noticed)
        if stored is None:
            passed = self._over_cap.get(key)
            if passed is not None and passed.expired():
                passed = None
            cap = self._cap(group) if passed is None else None
            if passed is not None or (cap is not None and nbytes > cap):
                return self._pass_over_cap(group, t, storage, key)
        self._release_copied()
        self._forward_peak = max(self._forward_peak, self._held)
        if stored is not None and stored.group is not group:
            if not stored.decided:
                # Backward reaches the later group first: the storage travels with it.
                stored.group = group
                group.records.append(ref)
                group.devices.add(stored.device)
            elif stored.where is not Where.DEVICE:
                # Already sent away by an earlier group, yet alive here: save it afresh
                # so this group's own prefetch brings it back.
                stored = None
        if stored is None:
            stored = self._new_record(group, t, storage, key)
        return self._handle(group, stored, t, index)

    def _handle(self, group: Group, stored: Stored, t: torch.Tensor, index: int | None) -> SavedTensor:
        """The saved handle of ``t`` on ``stored``: counted if its fate is decided, else
        one handle more, and its copy started now if the plan picked it (``index``)."""
        handle = SavedTensor(stored, group.index, t)
        if stored.decided:
            self._count(stored, 1)
        else:
            stored.handles += 1
            self._move_if_chosen(group, stored, index)
        return handle

    def _saving_group(self, t: torch.Tensor) -> Group:
        """The group a save (or a notice) of ``t`` belongs to."""
        group = self._current
        if group is None or group.index < 0:
            group = self._group_for_save(t.device)
        return group

    def _first_save(self, group: Group, key: int, nbytes: int) -> int | None:
        """The storage's index among ``group``'s saves the first time the group saves it
        (``None`` after that, or when the step keeps no log): the planner chooses whole
        storages by these sizes (queue_plan.py), and a learning group also marks where each
        is saved, to count its copy from there (early.py)."""
        if group.log is None or key in group.sizes:
            return None
        group.sizes[key] = nbytes
        if group.passthrough:
            group.saves.append(self._planner.timer.mark())
        return len(group.sizes) - 1

    def _new_record(self, group: Group, t: torch.Tensor, storage: Any, key: int) -> Stored:
        stored = Stored(group, t, storage)
        self._held += stored.nbytes
        ref = self._by_storage[key] = weakref.ref(stored)
        group.records.append(ref)
        group.devices.add(stored.device)
        return stored

    def _move_if_chosen(self, group: Group, stored: Stored, index: int | None) -> None:
        """A new record of a group that moves as it saves: its copy now if the plan picked
        it (by save index and size), else kept (over budget)."""
        if group.offloading:
            if group.picks is not None and not group.picks.take(index, stored.nbytes):
                self._decide(stored, Skip.BUDGET)
            else:
                self._offload([stored], group, after=None)

    def _pass(self, group: Group, t: torch.Tensor) -> Passed:
        """A tensor of a group that moves nothing: kept as it is, counted by the group
        (as kept, or over budget / learning, once the group is decided)."""
        if group.kept:
            count_skip(self.stats, Skip.KEPT)
        elif group.offloading:
            count_skip(self.stats, self._pass_reason())
        else:
            group.passed += 1
        return Passed(group, t)

    def _pass_over_cap(self, group: Group, t: torch.Tensor, storage: torch.UntypedStorage, key: int) -> Passed:
        """A storage over its group's cap: kept as it is (counted as over budget, or kept),
        its bytes held where the backward's prefetches measure room."""
        if group.kept:
            count_skip(self.stats, Skip.KEPT)
        elif group.offloading:
            count_skip(self.stats, Skip.BUDGET)
        else:
            group.passed_over_cap += 1
        nbytes = storage.nbytes()
        if key not in group.over_cap:
            # As for a record: the peak before this save, its bytes held from now on.
            self._forward_peak = max(self._forward_peak, self._held)
            group.over_cap[key] = nbytes
            group.over_cap_bytes += nbytes
            self._held += nbytes
            if key not in self._over_cap:
                self._over_cap[key] = StorageWeakRef(storage)
        return Passed(group, t, key)

    def _pass_reason(self) -> Skip:
        return Skip.LEARNING if self.group_budget_bytes == "auto" else Skip.BUDGET

    def _count(self, stored: Stored, n: int) -> None:
        if stored.outcome is None:
            self.stats["tensors_offloaded"] += n
        else:
            count_skip(self.stats, stored.outcome, n)

    def _decide(self, stored: Stored, outcome: Skip | None) -> None:
        stored.decided, stored.outcome = True, outcome
        self._count(stored, stored.handles)

    def _keep(self, group: Group) -> None:
        group.kept = True
        if group.passed or group.passed_over_cap:
            count_skip(self.stats, Skip.KEPT, group.passed + group.passed_over_cap)
            group.passed = group.passed_over_cap = 0
        for stored in group.live():
            if not stored.decided:
                self._decide(stored, Skip.KEPT)

    def _offload_group(self, group: Group) -> None:
        if group.offloading or group.kept:
            return
        group.offloading = True
        if group.passthrough:
            if group.passed:
                count_skip(self.stats, self._pass_reason(), group.passed)
                group.passed = 0
            return
        if group.passed_over_cap:
            count_skip(self.stats, Skip.BUDGET, group.passed_over_cap)
            group.passed_over_cap = 0
        if group.log is not None:
            self._plan(group)
        records = [s for s in group.live() if not s.decided]
        if group.log is not None and not group.learning:
            records = _fullest_first(records, group.budget_left)
        fences, group.fences = group.fences, {}
        # A fence serves one copy out (the link records it again afterwards).
        self._offload(records, group, after=fences)

    def _offload(self, records: list[Stored], group: Group, after: dict | None) -> None:
        """Copy ``records`` out (those the marks and the budget let through)."""
        # Per device: its records and their storages (read once; records on the device).
        # Runs per storage moved where groups move as they save (one record a call).
        chosen: dict[torch.device, list[tuple[Stored, torch.UntypedStorage]]] = {}
        budget = group.budget_left
        for stored in records:
            storage = stored.storage()
            if is_marked(storage):
                self._decide(stored, Skip.MARKED)
            elif budget is not None and stored.nbytes > budget:
                self._decide(stored, Skip.LEARNING if group.learning else Skip.BUDGET)
            else:
                if budget is not None:
                    budget -= stored.nbytes
                self._decide(stored, None)
                pairs = chosen.get(stored.device)
                if pairs is None:
                    chosen[stored.device] = [(stored, storage)]
                else:
                    pairs.append((stored, storage))
        group.budget_left = budget
        if not chosen:
            return
        moved = 0
        # The alias keeps the source alive until the copy is settled. A group copied
        # early settles where it would have when issued as group index + keep_last
        # started (early.py): only its copies' start moves.
        issued_in = max(len(self._groups) - 1, group.index + self.keep_last)
        log = self._planned_log(group)
        for device, pairs in chosen.items():
            link = link_for(device)
            fence = after.get(device) if after else None
            flats = []
            for stored, storage in pairs:
                # Copied after a later in-place write: unpack raises, as autograd would.
                stored.modified = stored.alias._version != stored.version
                flats.append(whole_storage(storage, device))
            blocks, done = link.copy_out(flats, fence if fence is not None else link.fence())
            give = link.arena.give
            batch = [stored for stored, _ in pairs]
            for stored, block in zip(batch, blocks):
                stored.host, stored.event, stored.where = block, done, Where.HOST
                # A record that dies on the host (no backward) still returns its block.
                stored.release = functools.partial(give, block, done)
                moved += stored.nbytes
            self.stats["storages_offloaded"] += len(batch)
            self._unsettled.append((issued_in, device, done, batch, log))
            self._copy_devices.add(device)
        self.stats["bytes_offloaded"] += moved
        self._on_host.add(group.index)
        if log is not None and self._planner is not None:
            self._planner.moved(log, group.position, moved)

    def _release_copied(self) -> None:
        """Release the sources of copies that have passed: nothing reads them any more,
        so neither stream needs to wait (the query never blocks). Runs at every save that
        keeps a record."""
        unsettled = self._unsettled
        if not unsettled:
            return
        # A device's copies out run on one stream, in the order issued (the order of
        # ``_unsettled``): once one has not passed, its later ones have not either, and
        # are not queried (one query per device while the device is behind the host);
        # once every device with copies is behind, the rest is not walked either.
        pending, behind = None, None
        for i, entry in enumerate(unsettled):
            device = entry[1]
            if behind is not None and device in behind:
                if pending is not None:
                    pending.append(entry)
            elif link_for(device).passed(entry[2]):
                if pending is None:
                    pending = unsettled[:i]
                self._drop_sources(entry[3])
            else:
                behind = {device} if behind is None else behind | {device}
                if len(behind) == len(self._copy_devices):
                    if pending is not None:
                        pending += unsettled[i:]
                    break
                if pending is not None:
                    pending.append(entry)
        if pending is not None:
            self._unsettled = pending

    def _drop_sources(self, batch: list[Stored]) -> None:
        for stored in batch:
            stored.modified |= stored.alias._version != stored.version
            stored.alias = None
            self._held -= stored.nbytes

    def _settle(self, before: int, at: Any = None) -> None:
        """Release the sources of copies issued while groups before ``before`` were
        current: the compute stream waits for those copies, the host does not. ``at``: a
        mark of the step now running at this point of the compute stream."""
        pending = []
        for entry in self._unsettled:
            issued_in, device, done, batch, log = entry
            if issued_in >= before:
                pending.append(entry)
                continue
            if log is not None:
                self._planner.waiting(log, done, at if log is self._log else None)
            link_for(device).settle(done)
            self._drop_sources(batch)
        self._unsettled = pending

    def _planned_log(self, group: Group) -> StepLog | None:
        """The log that learns how long compute waits for ``group``'s copies: its step's,
        when "auto" planned the group (learning steps move nothing)."""
        return group.log if group.log is not None and not group.learning else None
