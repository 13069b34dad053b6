"""The step's device memory as the offload scheduler accounts it, and where its peak falls.

The account is built from what the scheduler knows, not from the allocator's clock: the
bytes allocated when the step's first group starts (``base``: parameters, gradients already
allocated, optimizer state, inputs; ``torch.cuda.memory_allocated``, 0 on a CPU device),
each group's saved bytes (every storage that may move, once), the bytes it moved, and the
weight gradients its backward allocates (parameters of modules called in it whose ``.grad``
was ``None``). At its points:

- the forward of group ``j``: every group's saved bytes so far, less the moved bytes of
  groups whose copies have been settled (those of group ``h`` when group
  ``h + keep_last + 1 + lag`` starts);
- the backward of group ``g``: what groups before ``g - 1`` kept, groups ``g - 1``
  (prefetched) and ``g`` whole, the weight gradients of the groups after ``g``, and
  ``BACKWARD_WORKING`` times what ``g`` saved (its activation gradients and its ops'
  temporaries: the working memory of a backward);
- the weight gradients: ``base`` and every weight gradient, after the backward.

The same account, with every group but the last ``keep_last`` moving all it saved, is
the lowest peak offloading can reach (``Peak.lowest``); a memory target holds the
account under it (plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# A backward's working memory, in multiples of what its group saved: the gradients of its
# activations and its ops' temporaries. On a CPU device a fuseops MLP layer's backward
# holds about 1.75x (every storage alive, counted op by op: tests/offload/test_account.py,
# where 1 undercounts the step's peak); a target must hold, so 2. On a GPU, compare
# python -m benchmarks.offload's accounted peak with its measured one.
BACKWARD_WORKING = 2


@dataclass(frozen=True)
class GroupBytes:
    """One group of a step: bytes saved that may move, bytes moved, weight-gradient bytes."""

    saved: int
    moved: int
    grads: int


@dataclass(frozen=True)
class Peak:
    """The accounted peak (bytes), where it fell, and the lowest peak offloading reaches."""

    bytes: int
    where: str
    lowest: int


def points(base: int, groups: list[GroupBytes], keep_last: int, lag: int) -> list[tuple[int, str]]:
    """Every accounted point of the step: (bytes, where)."""
    n = len(groups)
    out = []
    saved = moved = 0
    for j, g in enumerate(groups):
        saved += g.saved
        settled = j - keep_last - 1 - lag
        if settled >= 0:
            moved += groups[settled].moved
        out.append((base + saved - moved, f"forward of group {j}"))
    kept = [g.saved - g.moved for g in groups]
    grads_after = 0
    for i in reversed(range(n)):
        held = (sum(kept[: max(0, i - 1)]) + (groups[i - 1].saved if i >= 1 else 0)
                + (1 + BACKWARD_WORKING) * groups[i].saved)
        out.append((base + held + grads_after, f"backward of group {i}"))
        grads_after += groups[i].grads
    out.append((base + grads_after, "weight gradients"))
    return out


def peak(base: int, groups: list[GroupBytes], keep_last: int, lag: int) -> Peak:
    """The highest accounted point of the step, and the same with everything moved."""
    if not groups:
        return Peak(base, "weight gradients", base)
    n = len(groups)
    bytes_, where = max(points(base, groups, keep_last, lag), key=lambda p: p[0])
    everything = [GroupBytes(g.saved, g.saved if i < n - keep_last else 0, g.grads) for i, g in enumerate(groups)]
    lowest = max(b for b, _ in points(base, everything, keep_last, lag))
    return Peak(bytes_, where, lowest)
