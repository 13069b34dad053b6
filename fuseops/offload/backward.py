"""The scheduler's backward: unpacking saved tensors, reloading groups from the host on
demand, and prefetching the previous group while this one's backward runs, so that a copy
neither waits on compute nor raises the peak (``BackwardPath._start_backward`` says when a
prefetch fires). ``Scheduler`` (scheduler.py) takes these methods from ``BackwardPath``;
the state they use is the scheduler's."""

from __future__ import annotations

from typing import Any

import torch

from fuseops.offload.link import empty_tensor, link_for
from fuseops.offload.records import Group, Passed, Stored, Where

# The share of its own saved bytes the first backward group consumes before the previous
# group's prefetch starts (see ``BackwardPath._start_backward``).
FIRST_PREFETCH_AFTER = 0.75


class BackwardPath:
    """The backward half of ``Scheduler`` (module docstring)."""

    def unpack(self, packed: Any) -> torch.Tensor:
        if type(packed) is Passed:
            group = packed.group
            if not group.backward_started:
                self._start_backward(group)
            if packed.key is not None:
                # As for a record: checked before counting this unpack.
                if group.prefetch is not None:
                    self._advance_prefetch(group)
                nbytes = group.over_cap.pop(packed.key, None)
                if nbytes is not None:
                    group.consumed += nbytes
            packed.check_version()
            return packed.tensor
        if isinstance(packed, torch.Tensor):
            return packed
        group = self._groups[packed.group]
        if not group.backward_started:
            self._start_backward(group)
        # Checked before counting this unpack: what earlier unpacks consumed is free by now.
        if group.prefetch is not None:
            self._advance_prefetch(group)
        stored = packed.stored
        if not stored.consumed:
            stored.consumed = True
            group.consumed += stored.nbytes
        stored.check_version()
        if stored.where is Where.HOST:
            self._reload([stored])
        if stored.where is Where.RELOADED:
            link_for(stored.device).consume(stored.data, stored.event)
            stored.release = None
        out = empty_tensor(stored.device, packed.dtype)
        return out.set_(stored.storage(), packed.offset, packed.size, packed.stride)

    def _start_backward(self, group: Group) -> None:
        """Reload ``group`` if its prefetch did not (on demand), and plan the prefetch of
        the previous group on the host, so that the copy does not raise the peak:

        - in the first group to run its backward (the step's peak is inside it: the
          forward's saved bytes and this backward's own gradients), once it has consumed
          ``FIRST_PREFETCH_AFTER`` of its own bytes: past the nodes that make that peak.
          Bytes consumed are no room there: without offloading they are freed just the
          same, and the gradients of the nodes after them fill them (a fused node consumes
          all it saved as it starts, and its gradients come before it frees them);
        - in later groups, as soon as there is room for it under the saved bytes the
          forward held on the device (in host order: kept records, and the sources of
          copies out the host had not yet seen pass, at their peak; or at the forward's
          end, if more), and no later than half of this group's bytes, so the copy keeps
          half of this backward to hide behind. When the link is behind compute (more
          moves than the forward hides), the forward held the groups in flight, so the
          prefetch starts with this group's backward and the link is not left idle while
          this group consumes half its bytes; the backward still holds no more saved
          bytes than the forward did."""
        group.backward_started = True
        first = not self._backward_seen
        if first:
            self._backward_seen = True
            if self._noticed:
                self._abandon_noticed()
            self.hold_target()
            self._resident_at_forward_end = self._resident_bytes()
            self._forward_peak = max(self._forward_peak, self._held)
        self._settle(len(self._groups))
        if not group.offloading:
            self._keep(group)
        self._reload_group(group)
        earlier = max((i for i in self._on_host if i < group.index), default=None)
        if earlier is not None:
            group.prefetch = self._groups[earlier]
            incoming = group.prefetch.live_bytes(on_host=True)
            own = group.live_bytes() + group.over_cap_bytes
            group.prefetch_issued = 0
            if first:
                group.prefetch_at, group.prefetch_room = int(FIRST_PREFETCH_AFTER * own), None
            else:
                ceiling = max(self._resident_at_forward_end, self._forward_peak)
                room = max(0, ceiling - self._resident_bytes())
                group.prefetch_at, group.prefetch_room = max(0, min(incoming, own // 2) - room), room
            self._advance_prefetch(group)

    def _advance_prefetch(self, group: Group) -> None:
        """Issue what ``group``'s prefetch may bring back now. The first backward group
        brings the whole previous group at once; later ones stream it, storage by storage
        in the order its backward needs them, into the room that the groups consumed so
        far left (their saved bytes less what came back), so the link starts early; all
        that is left goes at ``prefetch_at``. Bytes this group consumed are no room: its
        later nodes' gradients fill them, as without offloading (a CPU test shows a
        streamed copy that used them raising the peak by a storage)."""
        target, force = group.prefetch, group.consumed >= group.prefetch_at
        if group.prefetch_room is None:
            if force:
                self._reload_group(target)
                group.prefetch = None
            return
        allowance = group.prefetch_room - group.prefetch_issued
        # Runs at every unpack while a prefetch is armed: the target's records on the host
        # are walked lazily, last saved first, and only as far as the allowance reaches;
        # the walk resumes where the last one stopped (a record passed over is dead, moved
        # to another group or off the host, and stays so in backward), unless records
        # were added since.
        records = target.records
        if group.prefetch_walk[1] != len(records):
            group.prefetch_walk = (len(records), len(records))
        i = group.prefetch_walk[0]
        batch, issued, everything = [], 0, True
        while i > 0:
            stored = records[i - 1]()
            if stored is not None and stored.group is target and stored.where is Where.HOST:
                if not force and stored.nbytes > allowance:
                    everything = False
                    break
                batch.append(stored)
                allowance -= stored.nbytes
                issued += stored.nbytes
            i -= 1
        group.prefetch_walk = (i, len(records))
        if batch:
            group.prefetch_issued += issued
            self._reload(batch)
        if everything:
            self._on_host.discard(target.index)
            group.prefetch = None

    def _reload_group(self, group: Group) -> None:
        self._on_host.discard(group.index)
        self._reload(group.on_host())

    def _reload(self, records: list[Stored]) -> None:
        by_device: dict[torch.device, list[Stored]] = {}
        for stored in records:
            by_device.setdefault(stored.device, []).append(stored)
        for device, batch in by_device.items():
            for stored in batch:
                stored.release = None
            outs, done, guard = link_for(device).copy_in(
                [s.host for s in batch], [s.nbytes for s in batch], [s.event for s in batch])
            for stored, out in zip(batch, outs):
                stored.data, stored.host, stored.event, stored.where = out, None, done, Where.RELOADED
                # Dropped before any consumer waited: the wait happens as it dies.
                stored.release = guard
                self.stats["bytes_reloaded"] += stored.nbytes
