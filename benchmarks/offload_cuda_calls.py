"""The CUDA calls the offload scheduler makes per training step, counted on the CPU.

    python -m benchmarks.offload_cuda_calls [--stacks moe] [--budgets 0,auto,all] [--steps 4]

``CudaLink`` and ``EventTimer`` run unchanged over a CPU device, with ``torch.cuda``'s
event and stream classes, ``current_stream`` and the ``stream`` context replaced by
counting stand-ins (the copies run at once on the host; an event passes once its step
has ended, as on a device behind its host that the benchmark synchronises per step). The stacks and sizes are
those of ``benchmarks/offload_host.py``. Printed per step (mean over ``--steps`` after
``--warm-up``): events created, recorded, queried, timed (``elapsed_time``) and
destroyed, stream waits on events, copies issued on the copy streams, ``record_stream``
calls, ``current_stream`` lookups and stream switches. On a GPU every copy to or from
pinned memory also records one event inside torch's host allocator, not counted here.

How many tensors move differs from an H100 (the host clock times the "device", so
"auto" plans far more than the 13 of 93 tensors it moves on the moe stack there): the
calls per group and per tensor moved are what this measures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import time

import torch
from torch import nn

from benchmarks import offload as bench
from benchmarks.offload import STACKS, step
from benchmarks.offload_host import HIDDEN, SCALE, TOKENS
from fuseops.offload import link as link_module
from fuseops.offload import mark_not_offload, offload_activations
from fuseops.offload import planner as planner_module
from fuseops.offload.link import CudaLink
from fuseops.offload.planner import Planner
from fuseops.offload.timing import CopyMeter, EventTimer

CPU = torch.device("cpu")
COUNTS: collections.Counter[str] = collections.Counter()


# Steps synchronised so far: an event passes once the step it was recorded in has ended
# (a device behind its host, synchronised at each step's end, as in the benchmarks).
SYNCED = [0]


class FakeEvent:
    """A CUDA event's calls, counted; created on its first record, as torch's are."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.created, self.time, self.step = False, 0.0, 0

    def record(self, stream=None) -> None:
        if not self.created:
            self.created = True
            COUNTS["event create"] += 1
        COUNTS["event record"] += 1
        self.time, self.step = time.perf_counter(), SYNCED[0]

    def query(self) -> bool:
        COUNTS["event query"] += 1
        return self.step < SYNCED[0]

    def elapsed_time(self, end: FakeEvent) -> float:
        COUNTS["event elapsed_time"] += 1
        return (end.time - self.time) * 1e3

    def wait(self, stream=None) -> None:
        COUNTS["stream wait_event"] += 1

    def __del__(self) -> None:
        if self.created:
            COUNTS["event destroy"] += 1


class FakeStream:
    def __init__(self, device=None, priority: int = 0) -> None:
        self.device = device

    def wait_event(self, event: FakeEvent) -> None:
        event.wait(self)

    def wait_stream(self, other: FakeStream) -> None:
        self.wait_event(other.record_event())

    def record_event(self, event: FakeEvent | None = None) -> FakeEvent:
        event = event if event is not None else FakeEvent()
        event.record(self)
        return event


class Streams:
    def __init__(self) -> None:
        self.compute = FakeStream(CPU)
        self.current = self.compute

    def current_stream(self, device=None) -> FakeStream:
        COUNTS["current_stream"] += 1
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: FakeStream):
        COUNTS["stream switch"] += 1
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous


def install(patches: contextlib.ExitStack) -> None:
    """Counting stand-ins for torch.cuda's streams and events, a ``CudaLink`` and an
    event-timed planner for the CPU device (restored when ``patches`` closes)."""
    streams = Streams()
    copy = torch.Tensor.copy_

    def counted_copy(self, src, non_blocking=False):
        if streams.current is not streams.compute:
            COUNTS["copy on a copy stream"] += 1
        return copy(self, src, non_blocking)

    def counted_record_stream(self, stream):
        COUNTS["record_stream"] += 1

    for owner, name, value in [(torch.cuda, "Event", FakeEvent), (torch.cuda, "Stream", FakeStream),
                               (torch.cuda, "current_stream", streams.current_stream),
                               (torch.cuda, "stream", streams.stream), (torch.Tensor, "copy_", counted_copy),
                               (torch.Tensor, "record_stream", counted_record_stream)]:
        patches.callback(setattr, owner, name, getattr(owner, name))
        setattr(owner, name, value)
    link = CudaLink(CPU)
    link.meter = CopyMeter(EventTimer(CPU))
    for table, value in [(link_module._links, link),
                         (planner_module._planners, Planner(EventTimer(CPU), device=CPU))]:
        patches.callback(table.pop, CPU, None)
        table[CPU] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", default="mlp,moe")
    parser.add_argument("--budgets", default="0,auto,all")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warm-up", type=int, default=6, help="steps before counting (auto plans after 2-3)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    min_bytes = 2**18 // SCALE
    budgets = {"0": 0, "auto": "auto", "all": None}

    def scaled_context(name, budget):
        return offload_activations(keep_last=1, min_tensor_bytes=min_bytes, group_budget_bytes=budget)

    bench.scheme_context = scaled_context
    keys = ["event create", "event record", "event query", "event elapsed_time", "event destroy",
            "stream wait_event", "copy on a copy stream", "record_stream", "current_stream", "stream switch"]
    print(f"{'stack':>6} {'budget':>7} {'moved':>6} " + " ".join(f"{k:>{max(7, len(k))}}" for k in keys))
    for kind in args.stacks.split(","):
        for label in args.budgets.split(","):
            with contextlib.ExitStack() as patches:
                install(patches)
                layers = nn.ModuleList(STACKS[kind](HIDDEN) for _ in range(args.layers))
                x = torch.randn(1, TOKENS, HIDDEN)
                mark_not_offload(x)
                for _ in range(args.warm_up):
                    step(layers, x, "fuseops", budgets[label])
                    SYNCED[0] += 1
                COUNTS.clear()
                moved = 0
                for _ in range(args.steps):
                    moved += step(layers, x, "fuseops", budgets[label])["tensors_offloaded"]
                    SYNCED[0] += 1
            per = {k: COUNTS[k] / args.steps for k in keys}
            print(f"{kind:>6} {label:>7} {moved / args.steps:>6.0f} "
                  + " ".join(f"{per[k]:>{max(7, len(k))}.1f}" for k in keys))


if __name__ == "__main__":
    main()
