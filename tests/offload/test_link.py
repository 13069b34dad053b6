"""Links: copies round-trip (CPU); on CUDA no host syncs, no races, memory truly freed."""

import functools
import random
import weakref

import pytest
import torch

from fuseops.offload import host_arena, offload_activations
from fuseops.offload import link as link_module
from fuseops.offload.link import CudaLink, HostLink, link_for
from tests.offload._models import assert_bitwise, fuseops_layers, mlp_layers, run_step

CONFIGS = [dict(), dict(keep_last=0), dict(keep_last=2), dict(group_budget_bytes=12 * 2**20)]
CONFIG_IDS = ["keep1", "keep0", "keep2", "budget"]
CPU_CONFIGS = [dict(min_tensor_bytes=0), dict(min_tensor_bytes=0, keep_last=0),
               dict(min_tensor_bytes=1024, keep_last=2), dict(min_tensor_bytes=0, group_budget_bytes=20_000)]


class LazyLink(HostLink):
    """A CPU stand-in for an asynchronous link: a copy runs only when something waits
    on its event (``settle``, ``consume``, a copy that depends on it, a reused block's
    fence, a guard); until then its destination holds garbage. Sources are held weakly:
    one freed before its copy ran is counted in ``freed_early``. A scheduler that skips
    a wait reads garbage, and the bit-for-bit checks fail."""

    def __init__(self, device):
        super().__init__(device)
        self.pending: dict[object, list] = {}
        self.freed_early = 0
        self.copies = 0

    def _wait(self, event):
        for copy in self.pending.pop(event, []):
            copy()

    def copy_out(self, sources, after):
        done = object()
        blocks = []
        for src in sources:
            block = self.arena.take(src.numel())
            if block.fence is not None:
                self._wait(block.fence)
            block.data.fill_(0xAB)
            self.pending.setdefault(done, []).append(
                functools.partial(self._copy_out, block, weakref.ref(src.untyped_storage()), src.numel()))
            blocks.append(block)
        return blocks, done

    def _copy_out(self, block, storage_ref, n):
        self.copies += 1
        storage = storage_ref()
        if storage is None:
            self.freed_early += 1
            return
        block.data[:n].copy_(torch.empty(0, dtype=torch.uint8).set_(storage))

    def settle(self, done):
        self._wait(done)

    def passed(self, done):
        return done not in self.pending

    def copy_in(self, blocks, sizes, after):
        for event in after:
            self._wait(event)
        done = object()
        outs = []
        for block, n in zip(blocks, sizes):
            out = torch.full((n,), 0xCD, dtype=torch.uint8)
            self.pending.setdefault(done, []).append(functools.partial(out.copy_, block.data[:n]))
            self.arena.give(block, done)
            outs.append(out)
        return outs, done, functools.partial(self._wait, done)

    def consume(self, data, event):
        self._wait(event)


@pytest.fixture
def lazy_link(monkeypatch):
    link = LazyLink(torch.device("cpu"))
    monkeypatch.setitem(link_module._links, torch.device("cpu"), link)
    yield link
    assert link.freed_early == 0


@pytest.mark.parametrize("config", CPU_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("kind", ["torch", "fuseops"])
def test_every_wait_is_in_place_under_a_lazy_link(lazy_link, kind, config):
    layers = (mlp_layers if kind == "torch" else fuseops_layers)(n=4)
    x = torch.randn(40, 32)
    want = run_step(layers, x)
    got = run_step(layers, x, config, groups=kind == "torch")
    assert_bitwise(got, want)
    assert lazy_link.copies == got.offload.stats["storages_offloaded"] > 0


def test_a_dropped_graph_waits_for_its_reloads_under_a_lazy_link(lazy_link):
    layers, x = mlp_layers(n=3), torch.randn(40, 32, requires_grad=True)
    with offload_activations(min_tensor_bytes=0, group_budget_bytes=None) as handle:
        h = x
        for layer in layers:
            with handle.group():
                h = h + layer(h)
    loss = h.square().mean()
    torch.autograd.grad(loss, layers[-1][-1].weight)
    del loss, h
    assert not lazy_link.pending


def test_host_link_round_trip_returns_blocks():
    link = link_for(torch.device("cpu"))
    assert isinstance(link, HostLink)
    sources = [torch.randint(0, 255, (n,), dtype=torch.uint8) for n in (1, 5000, 70_000)]
    lent = link.arena.lent_bytes
    blocks, done = link.copy_out(sources, link.fence())
    outs, done, guard = link.copy_in(blocks, [s.numel() for s in sources], [done])
    assert all(torch.equal(o, s) and o.data_ptr() != s.data_ptr() for o, s in zip(outs, sources))
    assert link.arena.lent_bytes == lent and guard is None


def cuda_model(kind, n=6):
    if kind == "fuseops":
        return fuseops_layers(n=n, width=512, hidden=2048, device="cuda", dtype=torch.bfloat16), False
    return mlp_layers(n=n, width=512, hidden=2048, device="cuda", dtype=torch.bfloat16), True


class FakeStream:
    """A CUDA stream's waits, by name (equal when the names are, as streams by id)."""

    def __init__(self, name: str) -> None:
        self.name, self.waits = name, []

    def wait_event(self, event) -> None:
        self.waits.append(event)

    def __eq__(self, other) -> bool:
        return isinstance(other, FakeStream) and other.name == self.name

    __hash__ = None


class FakeBuffer:
    def __init__(self) -> None:
        self.recorded = []

    def record_stream(self, stream) -> None:
        self.recorded.append(stream.name)


def test_cuda_consume_waits_once_per_event_and_stream_and_records_only_off_the_allocation_stream(monkeypatch):
    compute, side = FakeStream("compute"), FakeStream("side")
    current = [compute]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    link = object.__new__(CudaLink)  # no streams of its own: consume uses none
    link.device, link._last_wait, link._allocated_on, link._mixed = "cuda", None, FakeStream("compute"), False
    first, second, buffers = object(), object(), [FakeBuffer() for _ in range(6)]
    link.consume(buffers[0], first)
    link.consume(buffers[1], first)
    link.consume(buffers[2], second)
    assert compute.waits == [first, second] and not any(b.recorded for b in buffers[:3])
    current[0] = side
    link.consume(buffers[3], second)
    link.consume(buffers[4], second)
    assert side.waits == [second] and buffers[3].recorded == buffers[4].recorded == ["side"]
    # Reload buffers allocated on two streams: every consumer records its stream.
    current[0], link._mixed = compute, True
    link.consume(buffers[5], first)
    assert compute.waits == [first, second, first] and buffers[5].recorded == ["compute"]


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("kind", ["torch", "fuseops"])
def test_cuda_stack_is_bitwise_and_accounted(kind, config):
    layers, groups = cuda_model(kind)
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    want = run_step(layers, x)
    got = run_step(layers, x, config, groups=groups)
    assert_bitwise(got, want)
    stats = got.offload.stats
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] > 0
    assert stats["groups"] >= len(layers)


@pytest.mark.gpu
def test_cuda_arena_is_pinned_reused_and_returned():
    arena = host_arena("cuda")
    assert arena.pinned and isinstance(link_for(torch.device("cuda")), CudaLink)
    layers, _ = cuda_model("torch")
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    lent = arena.lent_bytes
    run_step(layers, x, dict())
    allocations = arena.allocations
    for _ in range(3):
        run_step(layers, x, dict())
    assert arena.allocations == allocations and arena.lent_bytes == lent
    block = arena.take(10)
    assert block.data.is_pinned()
    arena.give(block)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["torch", "fuseops"])
def test_a_training_step_makes_no_host_sync(kind):
    layers, groups = cuda_model(kind)
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    want = run_step(layers, x, dict(), groups=groups)  # warm-up: pinned blocks, kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = run_step(layers, x, dict(), groups=groups)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert_bitwise(got, want)


def _delays(rng, layers, monkeypatch):
    """Random spins on the compute stream around every module, in forward and in backward;
    random spins on both copy streams before their copies; NaN-filled churn so freed
    blocks are reused at once. A missing wait anywhere shows up as a wrong bit."""

    def spin():
        if rng.random() < 0.6:
            torch.cuda._sleep(rng.randrange(1_000, 400_000))
        junk = torch.empty(rng.randrange(1, 8 << 20), dtype=torch.uint8, device="cuda")
        junk.fill_(255)

    handles = []
    for module in layers.modules():
        handles.append(module.register_forward_hook(lambda *_: spin()))
        handles.append(module.register_full_backward_pre_hook(lambda *_: spin()))

    def slow(stream_of, original):
        def call(self, *args):
            with torch.cuda.stream(stream_of(self)):
                if rng.random() < 0.6:
                    torch.cuda._sleep(rng.randrange(1_000, 400_000))
            return original(self, *args)

        return call

    monkeypatch.setattr(CudaLink, "copy_out", slow(lambda link: link.d2h, CudaLink.copy_out))
    monkeypatch.setattr(CudaLink, "copy_in", slow(lambda link: link.h2d, CudaLink.copy_in))
    return handles


@pytest.mark.gpu
def test_races_under_random_delays_are_bitwise_every_time(monkeypatch):
    layers, _ = cuda_model("torch")
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    want = run_step(layers, x)
    rng = random.Random(0)
    handles = _delays(rng, layers, monkeypatch)
    try:
        for run in range(48):
            config = CONFIGS[run % len(CONFIGS)]
            got = run_step(layers, x, dict(config, min_tensor_bytes=rng.choice([0, 2**18])))
            assert_bitwise(got, want)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.gpu
def test_peak_memory_drops_by_what_was_offloaded():
    n, tokens, width, hidden = 8, 8192, 1024, 4096
    layers = mlp_layers(n=n, width=width, hidden=hidden, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)

    def peak(config):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step = run_step(layers, x, config)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, step

    peak(None), peak(dict())  # warm-up
    without, _ = peak(None)
    with_offload, step = peak(dict())
    stats = step.offload.stats
    # bf16 per layer: its input, the norm's output, the GELU's input and output; layer
    # 0's input is the leaf (stays), layer n-1 is kept.
    group = 2 * tokens * (2 * width + 2 * hidden)
    assert stats["bytes_offloaded"] == (n - 1) * group - 2 * tokens * width
    # At the backward peak two offloaded groups are back: the one whose backward runs and
    # the previous one, prefetched once half of it is consumed (scheduler.py); the rest of
    # what moved is off the device. Measured on an H100 by this test: 780 MB saved against
    # 823 MB offloaded less two groups, with reloads issued early in link-bound steps. The
    # bound is 90 %.
    assert without - with_offload >= 0.90 * (stats["bytes_offloaded"] - 2 * group)
