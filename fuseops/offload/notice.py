"""The scheduler's save notices: records made before their saves, and the saves that find them.

fuseops' plan Function saves all its activations as its forward ends; the executor hands
each to ``notice`` as soon as it is made (``ops/executor/save_notice.py``), so that its
record, and its copy when its group moves as it saves, start then. The save that follows
(``Scheduler.pack``) finds the record by storage and version. ``Scheduler`` (scheduler.py)
takes these methods from ``NoticePath``; the state they use is the scheduler's.

A noticed tensor is checked twice otherwise (whether it may move, its group's sizes, the
record by storage): ``_pack_noticed`` is the save of the very tensor object noticed, on the
record its notice made, with only what may have changed in between checked again.
"""

from __future__ import annotations

import torch

from fuseops.offload.marks import is_marked
from fuseops.offload.records import SavedTensor, Skip, Stored, Where
from fuseops.offload.streams import refuse_capture


class NoticePath:
    """The notice half of ``Scheduler`` (module docstring)."""

    def notice(self, tensors: list[torch.Tensor]) -> None:
        """Tensors the executor will save once its forward ends (``save_notice.py``),
        each treated as saved now: its storage's size and its record are made here, so
        that its copy may start now when the group moves as it saves (``keep_last=0``:
        the same choice as at a save). The
        save that follows finds the record by storage and version (``pack``) and adds
        its handle; one changed in place meanwhile is saved afresh. Nothing is counted
        in the stats here: the save counts each tensor."""
        if tensors and tensors[0].is_cuda:
            refuse_capture()
        for t in tensors:
            if self._noticed and self._noticed_again(t):
                continue
            storage = self._skip_reason(t)
            if type(storage) is Skip:
                continue
            group = self._saving_group(t)
            key, nbytes = storage._cdata, storage.nbytes()
            self._first_save(group, key, nbytes)
            if group.passthrough:
                continue
            ref = self._by_storage.get(key)
            stored = ref() if ref is not None else None
            if stored is not None and not stored.ref.expired() and stored.version == t._version:
                # Recorded already at this version (noticed, or saved before): the save
                # decides what becomes of it, as for a second save.
                continue
            passed = self._over_cap.get(key)
            if passed is not None and not passed.expired():
                continue
            cap = self._cap(group)
            if cap is not None and nbytes > cap:
                continue
            self._release_copied()
            self._forward_peak = max(self._forward_peak, self._held)
            stored = self._new_record(group, t, storage, key)
            # The tensor too: its save is known by identity (``_pack_noticed``).
            self._noticed[key] = (t, stored)
            self._move_if_chosen(group, stored)

    def _noticed_again(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage has a noticed record, alive at ``t``'s version, in the
        group open now, which counted its size: ``notice`` would pass over it whatever it
        found (a reason to keep it, or the record), changing nothing. A fused step's
        early notice is followed by its step's own, naming the same tensors again."""
        key = t.untyped_storage()._cdata
        entry = self._noticed.get(key)
        if entry is None:
            return False
        stored = entry[1]
        group = stored.group
        if group is None or group is not self._current or stored.version != t._version or stored.ref.expired():
            return False
        ref = self._by_storage.get(key)
        return ref is not None and ref() is stored and key in group.sizes

    def _pack_noticed(self, t: torch.Tensor) -> SavedTensor | None:
        """The save of a noticed tensor: its handle on the record its notice made, or
        ``None`` where ``pack`` must decide afresh (not the tensor object noticed, or
        something that decision reads has changed since the notice).

        What this skips is what cannot have changed: the tensor object is the one the
        notice checked, so its type, base, device, layout and view bits are those the
        notice let through, and its record's group is the group open now, where the
        notice already counted the storage's size (``_first_save`` finds it there).
        Checked again, as ``pack`` would: its storage (the record is looked up by the
        storage the tensor has now), the record's storage alive and the tensor's version
        unchanged (changed in place: saved afresh), the grad state (a leaf that now
        requires grad stays), the storage's buffer and ``mark_not_offload`` marks and size."""
        storage = t.untyped_storage()
        key = storage._cdata
        entry = self._noticed.get(key)
        if entry is None or entry[0] is not t:
            return None
        stored = entry[1]
        group = self._current
        if group is None or stored.group is not group or stored.version != t._version or stored.ref.expired():
            return None
        ref = self._by_storage.get(key)
        if ref is None or ref() is not stored:
            return None
        base = t._base
        if base is None:
            base = t
        nbytes = storage.nbytes()
        if ((base.requires_grad and base.is_leaf) or storage in self.buffers or is_marked(storage)
                or nbytes < self._min_bytes):
            return None
        del self._noticed[key]
        # As ``pack`` for a record found at this version in the group saving it.
        self._release_copied()
        self._forward_peak = max(self._forward_peak, self._held)
        return self._handle(group, stored, t, None)

    def _abandon(self, key: int, stored: Stored) -> None:
        """A noticed record whose save did not come (the forward raised, the saves went
        to other hooks) or came at another version: out of its group, its bytes no
        longer held; it dies once nothing holds it (a copy it started settles first,
        then its host block goes back)."""
        ref = self._by_storage.get(key)
        if ref is not None and ref() is stored:
            del self._by_storage[key]
        if stored.where is Where.DEVICE:
            # A copy in flight is still held: ``_drop_sources`` counts it off as it settles.
            self._held -= stored.nbytes
            stored.alias = None
        stored.group = None
        stored.decided = True

    def _abandon_noticed(self) -> None:
        noticed, self._noticed = self._noticed, {}
        for key, (_, stored) in noticed.items():
            self._abandon(key, stored)
