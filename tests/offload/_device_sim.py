"""A simulated device for the offload scheduler on CPU: a compute stream and the two copy
streams in simulated seconds, events with their times, waits that move a stream's clock.

The real ``Scheduler`` and ``Planner`` run unchanged on top: ``SimLink`` stands in for
``CudaLink`` (the same calls, the same waits; the data is copied for real, at once), the
planner reads ``SimTimer`` marks, and layers of ``Node``s advance the compute stream by
the time each forward and backward node takes on an H100 (``STACKS``: the MLP and MoE
stacks of ``benchmarks/offload.py``, 8k tokens, H=4096, bf16), saving what those layers
save ("moe" saves x_sorted as permute makes it; "moe_plan" as fuseops runs the experts,
one Function saving x_sorted and z as it ends, and noticing them as it makes them:
``Experts``). Sizes are scaled down by ``SCALE`` (a simulated byte is ``SCALE`` real
ones; the link's rate scaled alike), so the scheduler sees the real sizes' proportions.

Memory: the device's bytes are the storages the nodes save (alive while the autograd
graph, or the scheduler's record or copy in flight, holds them) and the buffers reloads
make, sampled at every node's forward and backward with what that node holds besides
(its output; the incoming gradient and the one it returns): ``SimStep.peak``, the
step's highest sample. A node's gradients are its only transients, so the first
backward's peak is where the step's is, as on the GPU.

The host is infinitely fast and runs ahead: no copy is seen to pass within a step (as on
a GPU behind its host); marks pass when the step ends (the benchmark synchronises). So a
simulated step's time is what the plan costs the device: compute plus its waits on the
link, nothing of the host's own time.
"""

from __future__ import annotations

import contextlib
import functools
import random
from dataclasses import dataclass

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from fuseops.offload import arena as arena_module
from fuseops.offload import link as link_module
from fuseops.offload import mark_not_offload, offload_activations
from fuseops.offload import planner as planner_module
from fuseops.offload.planner import Planner
from fuseops.offload.timing import CopyMeter
from fuseops.ops.executor import save_notice

SCALE = 1024
MB = 2**20
CPU = torch.device("cpu")


@dataclass(eq=False)
class Event:
    time: float
    n: int


class SimDevice:
    """Stream clocks (seconds), event numbers and the seconds compute waited, by reason."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s / SCALE  # real (scaled-down) bytes per simulated second
        self.t = {"compute": 0.0, "d2h": 0.0, "h2d": 0.0}
        self.n = self.passed = 0
        self.waited = {"settle": 0.0, "consume": 0.0, "guard": 0.0}
        # Storages saved or reloaded (weakly, with their bytes), and the highest sample.
        self.resident: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def hold(self, t: torch.Tensor) -> None:
        """Count ``t``'s storage as long as it lives."""
        storage = t.untyped_storage()
        self.resident[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())

    def sample(self, *transients: torch.Tensor) -> None:
        """Resident bytes now, with ``transients`` (counted once each, and not again if
        held): the peak's candidates."""
        alive = {key: n for key, (ref, n) in self.resident.items() if not ref.expired()}
        extra = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in transients}
        total = sum(alive.values()) + sum(n for key, n in extra.items() if key not in alive)
        self.peak = max(self.peak, total * SCALE)

    def event(self, stream: str = "compute") -> Event:
        self.n += 1
        return Event(self.t[stream], self.n)

    def wait(self, stream: str, event: Event | None, why: str | None = None) -> None:
        if event is None:
            return
        if why is not None:
            self.waited[why] += max(0.0, event.time - self.t[stream])
        self.t[stream] = max(self.t[stream], event.time)

    def synchronize(self) -> None:
        self.passed = self.n
        end = max(self.t.values())
        self.t = dict.fromkeys(self.t, end)


class SimTimer:
    def __init__(self, device: SimDevice) -> None:
        self.device = device

    def mark(self, stream=None) -> Event:
        return self.device.event(stream or "compute")

    def seconds(self, start: Event, end: Event) -> float | None:
        if max(start.n, end.n) > self.device.passed:
            return None
        return end.time - start.time

    def passed(self, mark: Event) -> bool:
        return mark.n <= self.device.passed

    def elapsed(self, start: Event, end: Event) -> float:
        return end.time - start.time


class SimLink:
    """``CudaLink``'s calls on the simulated streams."""

    def __init__(self, device: SimDevice, timer: SimTimer) -> None:
        self.sim, self.device = device, CPU
        self.arena = arena_module.host_arena(CPU)
        self.meter = CopyMeter(timer)

    def fence(self) -> Event:
        return self.sim.event()

    def copy_out(self, sources, after):
        sim = self.sim
        sim.wait("d2h", after)
        blocks = [self.arena.take(src.numel()) for src in sources]
        for block in blocks:
            sim.wait("d2h", block.fence)
        start = sim.event("d2h")
        for src, block in zip(sources, blocks):
            block.data[: src.numel()].copy_(src)
        nbytes = sum(src.numel() for src in sources)
        sim.t["d2h"] += nbytes / sim.rate
        done = sim.event("d2h")
        self.meter.record(start, done, nbytes)
        return blocks, done

    def settle(self, done) -> None:
        self.sim.wait("compute", done, "settle")

    def passed(self, done) -> bool:
        return done is None or done.n <= self.sim.passed

    def copy_in(self, blocks, sizes, after):
        sim = self.sim
        sim.t["h2d"] = max(sim.t["h2d"], sim.t["compute"])  # waits for compute queued so far
        for event in after:
            sim.wait("h2d", event)
        start = sim.event("h2d")
        outs = [block.data[:n].clone() for block, n in zip(blocks, sizes)]
        for out in outs:
            sim.hold(out)
        sim.t["h2d"] += sum(sizes) / sim.rate
        done = sim.event("h2d")
        self.meter.record(start, done, sum(sizes))
        for block in blocks:
            self.arena.give(block, done)
        return outs, done, functools.partial(sim.wait, "compute", done, "guard")

    def consume(self, data, event) -> None:
        self.sim.wait("compute", event, "consume")


class Node(torch.autograd.Function):
    """A node taking ``forward_s`` / ``backward_s`` of compute, its output ``out_bytes``
    (simulated), saving its input or its output."""

    @staticmethod
    def forward(ctx, x, sim, forward_s, backward_s, out_bytes, saves_input):
        sim.t["compute"] += forward_s
        out = torch.zeros(max(1, out_bytes // SCALE // 4))
        ctx.sim, ctx.backward_s, ctx.shape = sim, backward_s, x.shape
        if saves_input is None:  # saves nothing that may move (permute: its row map)
            ctx.save_for_backward()
        else:
            saved = x if saves_input else out
            sim.hold(saved)
            ctx.save_for_backward(saved)
        sim.sample(out)
        return out

    @staticmethod
    def backward(ctx, dy):
        saved = ctx.saved_tensors  # unpacked as a real node's backward does
        del saved
        ctx.sim.t["compute"] += ctx.backward_s
        dx = torch.zeros(ctx.shape)
        ctx.sim.sample(dy, dx)
        return dx, None, None, None, None, None


class Experts(torch.autograd.Function):
    """The MoE expert MLP as fuseops runs it (``fusions/grouped_mlp.py``): one plan
    Function whose one fused step runs FC1's GEMM (``fc1_s``, its pre-activation ``z``
    of ``z_bytes``) then FC2's (``fc2_s``), saving its input ``x`` and ``z`` as the
    Function's forward ends. With ``notice``, each is handed to the executor's save
    notice receiver (``save_notice.py``) where the fused step notices it: ``x`` before
    FC1's GEMM, ``z`` between the two; without, the scheduler learns of both only at
    the save."""

    @staticmethod
    def forward(ctx, x, sim, fc1_s, fc2_s, backward_s, z_bytes, out_bytes, notice):
        receiver = save_notice.current_receiver() if notice else None
        if receiver is not None:
            receiver([x])
        sim.t["compute"] += fc1_s
        z = torch.zeros(max(1, z_bytes // SCALE // 4))
        sim.hold(z)
        if receiver is not None:
            receiver([z])
        sim.t["compute"] += fc2_s
        out = torch.zeros(max(1, out_bytes // SCALE // 4))
        ctx.sim, ctx.backward_s, ctx.shape = sim, backward_s, x.shape
        sim.hold(x)
        ctx.save_for_backward(x, z)
        sim.sample(out)
        return out

    @staticmethod
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        del saved
        ctx.sim.t["compute"] += ctx.backward_s
        dx = torch.zeros(ctx.shape)
        ctx.sim.sample(dy, dx)
        return dx, None, None, None, None, None, None, None


class Residual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, y, sim):
        sim.t["compute"] += 0.07e-3
        ctx.sim = sim
        return h.clone()

    @staticmethod
    def backward(ctx, dy):
        ctx.sim.t["compute"] += 0.05e-3
        return dy, dy.clone(), None


# Per node: name, forward ms, backward ms, output bytes, saves its input (else its output).
# The layer's input is 64 MB; times sum to about the H100 benchmark's per-layer forward and
# backward (measured with benchmarks/offload.py: mlp 3.3 / 7.08 ms, moe 1.95 / 4.3 ms, attn 6.1 / 14.5;
# attn's second residual is folded into the norm before the MLP, which saves the
# attention's output instead).
STACKS = {
    "mlp": [("norm", .08, .18, 64 * MB, True), ("fc1", 1.475, 3.25, 256 * MB, True),
            ("gelu", .2, .4, 256 * MB, True), ("fc2", 1.475, 3.25, 64 * MB, True)],
    "attn": [("norm1", .08, .18, 64 * MB, True), ("qkv", 1.1, 2.3, 192 * MB, True),
             ("attention", 1.3, 3.4, 64 * MB, True), ("proj", .4, .8, 64 * MB, True),
             ("norm2", .08, .18, 64 * MB, True), ("fc1", 1.55, 3.25, 256 * MB, True),
             ("gelu", .2, .4, 256 * MB, True), ("fc2", 1.55, 3.25, 64 * MB, True)],
    "moe": [("router", .06, .12, 256 * 1024, True), ("softmax", .02, .02, 256 * 1024, False),
            ("permute", .15, .2, 128 * MB, False), ("fc1", 1.5, 3.7, 176 * MB, True),
            ("fc2", 0.0, 0.0, 128 * MB, True), ("unpermute", .15, .2, 64 * MB, True)],
    # As fuseops runs it: permute saves no activation; the experts are one Function
    # (``Experts``: FC1 1.0 ms, its output z 176 MB, then FC2 0.5 ms, the GEMMs' FLOPs
    # 2 : 1) saving x_sorted and z as it ends; unpermute saves y_sorted.
    "moe_plan": [("router", .06, .12, 256 * 1024, True), ("softmax", .02, .02, 256 * 1024, False),
                 ("permute", .15, .2, 128 * MB, None), ("experts", (1.0, .5), 3.7, (176 * MB, 128 * MB), None),
                 ("unpermute", .15, .2, 64 * MB, True)],
}


class Layer(nn.Module):
    """``jitter``: each node's times scaled by a factor drawn from ``rng`` in
    [1 - jitter, 1 + jitter] at every call (kernel times on a GPU vary step to step)."""

    def __init__(self, sim: SimDevice, nodes: list, jitter: float = 0.0, rng: random.Random | None = None,
                 notice: bool = True) -> None:
        super().__init__()
        self.sim, self.nodes, self.jitter, self.rng, self.notice = sim, nodes, jitter, rng, notice

    def forward(self, h):
        y = h
        for name, forward_ms, backward_ms, out_bytes, saves_input in self.nodes:
            f = self.rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
            if name == "experts":
                (fc1_ms, fc2_ms), (z_bytes, y_bytes) = forward_ms, out_bytes
                y = Experts.apply(y, self.sim, f * fc1_ms / 1e3, f * fc2_ms / 1e3, f * backward_ms / 1e3, z_bytes,
                                  y_bytes, self.notice)
                continue
            y = Node.apply(y, self.sim, f * forward_ms / 1e3, f * backward_ms / 1e3, out_bytes, saves_input)
        return Residual.apply(h, y, self.sim)


@dataclass
class SimStep:
    seconds: float  # the compute stream's time for the step
    moved: int  # simulated bytes offloaded
    waited: dict[str, float]  # seconds compute waited on the link, by reason
    peak: int  # simulated bytes resident at the step's highest sample (see the docstring)


def install(monkeypatch, bytes_per_s: float = 50e9) -> SimDevice:
    """A fresh simulated device behind the CPU link, planner and arena."""
    sim = SimDevice(bytes_per_s)
    timer = SimTimer(sim)
    monkeypatch.setattr(arena_module, "_arenas", {})
    monkeypatch.setitem(link_module._links, CPU, SimLink(sim, timer))
    monkeypatch.setitem(planner_module._planners, CPU, Planner(timer, device=CPU))
    # The bandwidth planned with before a copy has been measured: the link's standalone one.
    monkeypatch.setattr(planner_module, "PINNED_BYTES_PER_S", 54.7e9 / SCALE)
    return sim


def run(monkeypatch, kind: str, budget, steps: int = 6, layers: int = 8, bytes_per_s: float = 50e9,
        jitter: float = 0.0, seed: int = 0, notice: bool = True,
        slow: dict[int, float] | None = None) -> list[SimStep]:
    """``steps`` training steps of the ``kind`` stack with ``budget`` ("none": no offload;
    an int in simulated bytes), one offload group per layer, keep_last=1, on a link of
    ``bytes_per_s`` each way (50 GB/s: what the H100's copies achieve beside compute);
    node times varied by ``jitter`` (see ``Layer``), drawn from ``seed``; ``notice``:
    whether a plan Function's saves are noticed as produced (``Experts``); ``slow``: per
    step index, a factor on the link's rate in that step (copies slower beside compute in
    that step only)."""
    sim = install(monkeypatch, bytes_per_s)
    rng = random.Random(seed)
    model = nn.ModuleList(Layer(sim, STACKS[kind], jitter, rng, notice) for _ in range(layers))
    x = torch.zeros(64 * MB // SCALE // 4, requires_grad=True)
    mark_not_offload(x)
    out = []
    rate = sim.rate
    for index in range(steps):
        sim.rate = rate * (slow or {}).get(index, 1.0)
        sim.waited, sim.peak = dict.fromkeys(sim.waited, 0.0), 0
        start = sim.t["compute"]
        scope = contextlib.nullcontext() if budget == "none" else offload_activations(
            keep_last=1, min_tensor_bytes=2**18 // SCALE,
            group_budget_bytes=budget // SCALE if isinstance(budget, int) else budget)
        with scope as handle:
            h = x
            for layer in model:
                with handle.group() if handle is not None else contextlib.nullcontext():
                    h = layer(h)
        h.sum().backward()
        sim.synchronize()
        moved = handle.stats["bytes_offloaded"] * SCALE if handle is not None else 0
        out.append(SimStep(sim.t["compute"] - start, moved, dict(sim.waited), sim.peak))
    return out


def forward_seconds(kind: str, layers: int = 8) -> float:
    per_layer = sum(sum(n[1]) if isinstance(n[1], tuple) else n[1] for n in STACKS[kind])
    return layers * (per_layer + 0.07) / 1e3
