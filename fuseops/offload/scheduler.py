"""The offload scheduler: groups of saved tensors, what moves to the host, and when.

Every tensor saved for backward inside the context reaches ``pack`` (torch's
saved-tensor hooks; fuseops' fuser saves activations, one plain buffer at a time,
through the same door). fuseops' plan Function saves all its activations as its
forward ends, so the executor also hands each to ``notice`` as soon as it is made
(``ops/executor/save_notice.py``; hooks.py passes it on, notice.py takes it): its
record is made there, as a save would make it, and the save that follows finds it by
storage and version (one changed in place in between is saved afresh; one whose save
never comes is dropped as its group ends, ``_abandon``).
What is kept where it is, and why, is decided in ``pack``: parameters and their views,
other leaves that require grad, module buffers, marked storages, small storages and
tensors that are not plain strided CPU/CUDA tensors.
Everything else becomes a ``SavedTensor`` handle on a ``Stored`` record (records.py),
one per storage (at one version): views share their storage's record and are rebuilt
with their exact size, stride and offset. A group that can move nothing (an int budget
under ``min_tensor_bytes`` and no memory target) passes its tensors through in a
``Passed`` handle that only marks the group's backward; so does a storage larger than
an int budget (``_pass_over_cap``), whose bytes still count where the backward's
prefetches measure room (``_resident_bytes``).

Groups follow the forward in order. A group is decided once ``keep_last`` later groups
exist (so the last ``keep_last`` stay on the device; with ``keep_last=0`` each tensor is
decided as it is saved), and its copies start after the fence its producer recorded when
the group closed. What it moves is a function of the model, its shapes and the settings
alone, the same at every step and in every process (plan.py): with ``"auto"``, the
whole storages that fill what the link hides behind the group's compute (estimate.py:
stated rates, FLOPs or the saved-bytes rule); an int caps the bytes in save order;
``None`` moves all; a memory target then moves what it must (plan.py). The sources of
those copies are released when group ``index + keep_last + 1 + lag`` starts (the
compute stream waits for the copies there, the host never does; ``lag`` is 1 with
``"auto"`` and no target: a group's copies may spill into the next group's compute), or
sooner, at any later save, once the copy has passed (a non-blocking query). In
backward, the first unpack of a group reloads it if its prefetch did not, and arms the
prefetch of the previous group on the host, one group ahead (backward.py).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fuseops.offload.backward import BackwardPath
from fuseops.offload.link import link_for, whole_storage
from fuseops.offload.marks import StorageSet, is_marked
from fuseops.offload.notice import NoticePath
from fuseops.offload.plan import StepPlan
from fuseops.offload.records import Group, Passed, SavedTensor, Skip, Stored, Where, count_skip, new_stats
from fuseops.offload.streams import refuse_capture


class Scheduler(NoticePath, BackwardPath):
    """Offload state of one ``offload_activations`` context (see the module docstring; its
    save notices are ``NoticePath`` in notice.py, its backward half, unpack, reloads and
    prefetches, ``BackwardPath`` in backward.py)."""

    def __init__(self, *, keep_last: int, min_tensor_bytes: int, group_budget_bytes: int | str | None,
                 peak_bytes_target: int | None = None, link_bytes_per_s: float | None = None) -> None:
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
        # the smallest storage that may move, and no memory target to move more.
        self._cannot_move = (isinstance(group_budget_bytes, int) and group_budget_bytes < max(min_tensor_bytes, 1)
                             and peak_bytes_target is None)
        # What each group moves, and the step's account (plan.py).
        self.plan = StepPlan(budget=group_budget_bytes, keep_last=keep_last, target=peak_bytes_target,
                             link_bytes_per_s=link_bytes_per_s)
        # Copies out not yet settled: (group current when issued, device, event, records).
        self._unsettled: list[tuple[int, torch.device, Any, list[Stored]]] = []
        # Every device copies out were issued on (``_release_copied``: when all are behind).
        self._copy_devices: set[torch.device] = set()
        # Groups opened by the fuseops.Sequential calls now running (None: nested call).
        self.sequential_groups: list[Group | None] = []
        # Copies issued while group i was current are settled when group i + 1 + lag
        # starts (plan.py: "auto" lets a group's copies spill into the next group).
        self._settle_lag = self.plan.lag
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
        elif group is not None and group.grads:
            # Modules called, nothing saved that may move: not a group of the step, but
            # its weight gradients still come (plan.py).
            self.plan.unsaved_grads(group.grads)

    def finish(self) -> None:
        """The context ends: groups not offloaded by now are the last ``keep_last``."""
        self._close_current()
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
            if self._backward_seen:
                self._new_step()
            group.index = len(self._groups)
            group.passthrough = self._cannot_move
            self._groups.append(group)
            self.stats["groups"] += 1
            self.plan.start_group(group, device)
            # Copies issued before the last (1 + lag) groups had their compute to finish in.
            self._settle(group.index - self._settle_lag)
            older = group.index - self.keep_last
            if older >= 0:
                self._offload_group(self._groups[older])
        return group

    def _new_step(self) -> None:
        """A forward after a backward (a second step in the same context) starts afresh."""
        for old in self._groups:
            old.over_cap.clear()
        self._over_cap.clear()
        self._held, self._forward_peak = self._resident_bytes(), 0
        self._backward_seen = False
        self.plan.begin()

    def count_module(self, module: torch.nn.Module, args: tuple) -> None:
        """A module called inside the context (hooks.py): its FLOPs and weight gradients
        count to the group it runs in (plan.py). Not calls the backward makes (a
        checkpoint's recompute): they are no step's forward."""
        if torch._C._current_graph_task_id() != -1:
            return
        if self._backward_seen:
            self._new_step()
        if self._current is None:
            # As for a save between groups: a group of its own, ended by the next.
            self._current = Group()
        self.plan.count_module(self._current, module, args)

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
        bound): an int budget without a memory target."""
        if isinstance(self.group_budget_bytes, int) and self.plan.target is None:
            return self.group_budget_bytes
        return None

    def _count_planned(self, allowance: int | None) -> None:
        """What the plan gave a group and the rates it counted with: the user's view of
        "auto" (``ActivationOffload.stats``)."""
        if allowance is None or self.group_budget_bytes != "auto":
            return
        rates = self.plan.rates
        self.stats["groups_planned"] += 1
        self.stats["planned_bytes"] += allowance
        self.stats["planned_bytes_per_s"] = int(rates.link_bytes_per_s)
        self.stats["planned_flops_per_s"] = int(rates.flops_per_s)

    def peak_stats(self) -> dict[str, int | str]:
        """The step's accounted peak (peak.py): where it fell, and how much lower moving
        everything would bring it."""
        if not self.plan.groups:
            return {}
        peak = self.plan.peak()
        return dict(peak_bytes=peak.bytes, peak_where=peak.where, peak_lowest_bytes=peak.lowest,
                    peak_offload_can_lower=peak.bytes - peak.lowest)

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
        stored.handles += 1
        if stored.decided:
            self._count(stored, 1)
        else:
            self._move_if_chosen(group, stored)
        return handle

    def _saving_group(self, t: torch.Tensor) -> Group:
        """The group a save (or a notice) of ``t`` belongs to."""
        group = self._current
        if group is None or group.index < 0:
            group = self._group_for_save(t.device)
        return group

    def _first_save(self, group: Group, key: int, nbytes: int) -> int | None:
        """The storage's index among ``group``'s saves the first time the group saves it
        (``None`` after that): its bytes count to the group's saved bytes (plan.py)."""
        if key in group.sizes:
            return None
        group.sizes[key] = nbytes
        group.saved += nbytes
        if self.plan.target is not None:
            self.plan.check_floor()
        return len(group.sizes) - 1

    def _new_record(self, group: Group, t: torch.Tensor, storage: Any, key: int) -> Stored:
        stored = Stored(group, t, storage)
        self._held += stored.nbytes
        ref = self._by_storage[key] = weakref.ref(stored)
        group.records.append(ref)
        group.devices.add(stored.device)
        return stored

    def _move_if_chosen(self, group: Group, stored: Stored) -> None:
        """A new record of a group that moves as it saves (``keep_last=0``): its copy now if
        its allowance so far fits it, or the memory target needs it, else kept."""
        if not group.offloading:
            return
        plan = self.plan
        if plan.budget == "auto":
            # Its allowance grows with the group's FLOPs and bytes known so far.
            group.budget_left = plan.allowance(group) - group.moved
        budget = group.budget_left
        if budget is not None and stored.nbytes > budget and not plan.over_target():
            self._decide(stored, Skip.BUDGET)
            return
        before = group.moved
        self._offload([stored], group, after=None, budget=None)
        moved = group.moved - before
        if budget is not None and stored.nbytes > budget:
            self.stats["bytes_for_target"] += moved
        elif budget is not None:
            group.budget_left = budget - moved

    def _pass(self, group: Group, t: torch.Tensor) -> Passed:
        """A tensor of a group that moves nothing: kept as it is, counted by the group
        (as kept, or over budget / learning, once the group is decided)."""
        if group.kept:
            count_skip(self.stats, Skip.KEPT)
        elif group.offloading:
            count_skip(self.stats, Skip.BUDGET)
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
        """Decide ``group`` (plan.py): what it moves by default, then what the memory
        target needs; with ``keep_last=0`` its storages are decided as they are saved."""
        if group.offloading or group.kept:
            return
        group.offloading = True
        plan = self.plan
        if group.passthrough:
            if group.passed:
                count_skip(self.stats, Skip.BUDGET, group.passed)
                group.passed = 0
            return
        if group.passed_over_cap:
            count_skip(self.stats, Skip.BUDGET, group.passed_over_cap)
            group.passed_over_cap = 0
        allowance = plan.allowance(group)
        self._count_planned(allowance)
        if self.keep_last == 0:
            group.budget_left = allowance
            return
        records = [s for s in group.live() if not s.decided]
        chosen = set(plan.choose([s.nbytes for s in records], allowance))
        moving = [s for i, s in enumerate(records) if i in chosen]
        staying = [s for i, s in enumerate(records) if i not in chosen]
        fences, group.fences = group.fences, {}
        # A fence serves one copy out (the link records it again afterwards).
        self._offload(moving, group, after=fences, budget=None)
        for stored in staying:
            self._decide(stored, Skip.BUDGET)
        plan.decided(group, allowance)
        if plan.target is not None:
            self._move_for_target(group)

    def _move_for_target(self, group: Group | None) -> None:
        """Move what the memory target needs beyond the default: ``group``'s kept storages
        in save order, then those the step's earlier groups kept, earliest first (plan.py)."""
        plan = self.plan
        first = [group] if group is not None else []
        for earlier in first + [g for g in plan.groups if g is not group and g.offloading and not g.kept]:
            for stored in earlier.live():
                if not plan.over_target():
                    return
                if stored.outcome is not Skip.BUDGET or stored.where is not Where.DEVICE:
                    continue
                # Counted as kept so far: counted again as moved.
                count_skip(self.stats, Skip.BUDGET, -stored.handles)
                stored.decided = False
                before = earlier.moved
                self._offload([stored], earlier, after=None, budget=None)
                self.stats["bytes_for_target"] += earlier.moved - before

    def hold_target(self) -> None:
        """The forward is over (the backward starts): the whole step is known. Storages
        kept so far move until its account holds the target, or a ``ValueError`` names
        the lowest peak moving everything reaches (plan.py)."""
        if self.plan.target is None:
            return
        self.plan.check_lowest()
        self._move_for_target(None)

    def _offload(self, records: list[Stored], group: Group, after: dict | None, budget: int | None) -> None:
        """Copy ``records`` out (those the marks and ``budget``, in order, let through)."""
        # Per device: its records and their storages (read once; records on the device).
        # Runs per storage moved where groups move as they save (one record a call).
        chosen: dict[torch.device, list[tuple[Stored, torch.UntypedStorage]]] = {}
        for stored in records:
            storage = stored.storage()
            if is_marked(storage):
                self._decide(stored, Skip.MARKED)
            elif budget is not None and stored.nbytes > budget:
                self._decide(stored, Skip.BUDGET)
            else:
                if budget is not None:
                    budget -= stored.nbytes
                self._decide(stored, None)
                pairs = chosen.get(stored.device)
                if pairs is None:
                    chosen[stored.device] = [(stored, storage)]
                else:
                    pairs.append((stored, storage))
        if not chosen:
            return
        moved = 0
        # The alias keeps the source alive until the copy is settled, where it would be
        # had it been issued as group index + keep_last started.
        issued_in = max(len(self._groups) - 1, group.index + self.keep_last)
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
            self._unsettled.append((issued_in, device, done, batch))
            self._copy_devices.add(device)
        self.stats["bytes_offloaded"] += moved
        group.moved += moved
        self._on_host.add(group.index)

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

    def _settle(self, before: int) -> None:
        """Release the sources of copies issued while groups before ``before`` were
        current: the compute stream waits for those copies, the host does not."""
        pending = []
        for entry in self._unsettled:
            issued_in, device, done, batch = entry
            if issued_in >= before:
                pending.append(entry)
                continue
            link_for(device).settle(done)
            self._drop_sources(batch)
        self._unsettled = pending
