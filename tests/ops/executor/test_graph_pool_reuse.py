"""Dead graph results reused by later captures (``fuseops/ops/executor/graph_pool.py``: the
allocator's pool checkpoints, the cover of live results handed out again, the pool's release) on the
CPU: a stand-in allocator (checkpoints, best fit with a small pool) and stand-in pools whose replays
write over every result dead at their capture."""

from __future__ import annotations

import gc

import pytest
import torch

from fuseops.ops.executor import graph_pool, graphed
from tests.helpers import assert_bitwise
from tests.ops.executor.test_graph_pool import _a_kept_output_loop, _PoolThatClobbers
from tests.ops.executor.test_graphed_states import _delta, cpu_graphs  # noqa: F401 (cpu_graphs: a fixture)


class _Allocator:
    """The allocator's pool checkpoints stood in for (``graph_pool.checkpoint_state``,
    ``restore_state``, ``give_back``): what the pool asked of them."""

    def __init__(self, monkeypatch) -> None:
        self.checkpoints = self.restores = 0
        self.given: list[int] = []
        # Free blocks a cover may take (start, end, small), none unless a test says so.
        self.free: list[tuple[int, int, bool]] = []
        self.taken: list[int] = []
        monkeypatch.setattr(graph_pool, "reuses_dead_results", lambda device: True)
        monkeypatch.setattr(graph_pool, "checkpoint_state", self.checkpoint)
        monkeypatch.setattr(graph_pool, "restore_state", self.restore)
        monkeypatch.setattr(graph_pool, "give_back", self.given.append)
        monkeypatch.setattr(graph_pool, "free_blocks", lambda device, handle, stream: list(self.free))
        monkeypatch.setattr(graph_pool, "allocate_in_pool", self.allocate)
        monkeypatch.setattr(graph_pool, "_pools", {})

    def allocate(self, device, handle, stream, nbytes):
        """The caching allocator's best fit: of the free blocks of the request's pool (small up to
        ``SMALL_REQUEST``) at least ``nbytes`` long, the shortest, then the lowest; split, the
        request at its start; with none, a new segment's (far above the others)."""
        small = nbytes <= graph_pool.SMALL_REQUEST
        fits = [b for b in self.free if b[2] == small and b[1] - b[0] >= nbytes]
        if not fits:
            self.taken.append((1 << 60) + (len(self.taken) << 30))
            return _Block(self.taken[-1], nbytes)
        start, end, _ = min(fits, key=lambda b: (b[1] - b[0], b[0]))
        self.free.remove((start, end, small))
        if end > start + nbytes:
            self.free.append((start + nbytes, end, small))
        self.taken.append(start)
        return _Block(start, nbytes)

    def checkpoint(self, device, handle):
        self.checkpoints += 1
        return self.checkpoints

    def restore(self, device, state):
        assert state == self.checkpoints, "restored a state other than the last capture's"
        self.restores += 1


class _Block:
    """A block a cover allocated in the pool (stand-in): its address and size."""

    def __init__(self, start: int, nbytes: int) -> None:
        self.start, self.nbytes = start, nbytes

    def data_ptr(self) -> int:
        return self.start


class _Stream:
    cuda_stream = 7


class _Member:
    """A program holding a graph (``SharedPool``'s view of it): its write set and results."""

    def __init__(self, writes, results, capture_id=1) -> None:
        self.writes, self.clobbers, self.capture_id = writes, [], capture_id
        self.pool_results = list(results)
        self.storages = [r.untyped_storage() for r in results]
        self.memory = list(results)  # what the pool's memory would hold after disowning them
        self.disowned = False

    def disown(self):
        graphed.GraphedProgram.disown(self)
        self.disowned = True

    def settle(self):
        self.alone = [(s._cdata, torch._C._storage_Use_Count(s._cdata)) for s in self.storages]
        return self


def test_dead_results_go_back_to_the_pool_before_a_capture_and_live_ones_stay_allocated(monkeypatch):
    """Where the pool reuses dead results: a newcomer's results go out disowned (over storages
    that do not own the memory) after the checkpoint; before the next capture the state is
    restored, the dead results given back and the live ones kept allocated; a newcomer whose
    write set holds a result dead at its capture notes it (it must not replay while that one
    lives again), never a live one; old results dead for good are dropped."""
    allocator = _Allocator(monkeypatch)
    pool = graph_pool.for_device(torch.device("cpu"))
    assert pool.reuses
    a = _Member((), [torch.arange(4.0), torch.arange(8.0)])
    pool.admit(a)
    a.settle()
    assert a.disowned and allocator.checkpoints == 1
    assert_bitwise(a.pool_results[1], torch.arange(8.0), "a disowned result")
    kept = a.pool_results[0].detach()  # A's first result handed out and kept; the second dead
    pool.reclaim()
    first, second = pool.results
    assert allocator.restores == 1 and allocator.given == [second.start]
    assert first.allocated and not second.allocated
    everywhere = ((0, 2**64),)
    b = _Member(everywhere, [torch.zeros(2)])
    pool.admit(b)
    b.settle()
    assert b.clobbers == [second], "B may write over A's dead result only"
    assert all(r.owner() is b for r in a.clobbers) and not a.clobbers, "A's write set is empty"
    assert first.in_checkpoint and not second.in_checkpoint and pool.results[-1].in_checkpoint
    # A captured again (its old results followed by weak references from then on), the kept
    # result dropped: every result in the checkpoint is dead (B's too), and A's are gone for good.
    a.capture_id = 2
    a.pool_results = a.storages = []
    del kept
    (mine,) = [r for r in pool.results if r.owner() is b]
    pool.reclaim()
    assert allocator.given == [second.start, first.start, mine.start], "a dead result not given back"
    assert pool.results == [mine], "only B's result may live again (at B's next replay)"


def test_the_pool_is_released_once_no_graph_is_in_it_and_no_result_lives(monkeypatch):
    """A member freed while a result it handed out lives keeps the pool; once that result is
    gone, ``release_if_idle`` (``graphed.free``) gives back what is still allocated and releases
    it."""
    allocator = _Allocator(monkeypatch)
    pool = graph_pool.for_device(torch.device("cpu"))
    a = _Member((), [torch.arange(4.0)])
    pool.admit(a)
    a.settle()
    kept = a.pool_results[0].detach()
    pool.reclaim()  # A's result alive: kept allocated
    assert pool.results[0].allocated
    a.capture_id = 0
    a.pool_results = a.storages = []
    pool._state = "the last checkpoint"
    pool.leave(a)
    assert pool._state is not None and pool.results, "released under a live result"
    assert_bitwise(kept, torch.arange(4.0), "the kept result")
    start = pool.results[0].start
    del kept
    graphed.free()
    assert pool._state is None and pool.results == [] and allocator.given == [start]


class _PoolThatReuses(_PoolThatClobbers):
    """``_PoolThatClobbers`` where the pool reuses dead results (``_Allocator``): each replay
    also writes (NaN) over every result dead at its capture (given back by ``reclaim``, so that
    a capture could place its own memory there), whether or not that result lives again."""

    def __init__(self) -> None:
        super().__init__()
        # The stand-in graphs' kept results by address: the pool's memory, for the test's life
        # (a disowned result handed out reads it after its graph is freed, as pool memory stays).
        self.memory: dict[int, torch.Tensor] = {}

    def capture(self, body, static, device, after_warm_up, pool):
        if pool is not None:
            pool.reclaim()
        graph, results, writes = super().capture(body, static, device, after_warm_up, pool)
        if pool is None:
            return graph, results, writes
        self.memory.update((t.untyped_storage().data_ptr(), t) for t in graph.results if t is not None)
        over = [r for r in pool.results if not r.allocated]
        replay = graph.replay

        def replay_over_dead_results():
            replay()
            for r in over:
                if r.start in self.memory:
                    self.memory[r.start].fill_(float("nan"))
        graph.replay = replay_over_dead_results
        return graph, results, writes


@pytest.mark.parametrize("rule", ["on", "off"])
@pytest.mark.usefixtures("cpu_graphs")
def test_a_graph_never_replays_over_an_earlier_graphs_result_dead_at_its_capture(rule, monkeypatch):
    """A captured first, its result dead when B is captured: B's memory may lie there (the pool
    reuses dead results). While the caller keeps A's result past B's call, B runs eagerly
    (``clobbered``) and the kept result stays as A made it; A, finding its result alive at its
    next call, hands it out as a copy from then on, so B replays again. With the rule off
    (control), B's replay overwrites it."""
    _Allocator(monkeypatch)
    monkeypatch.setattr(graphed, "capture", _PoolThatReuses().capture)
    if rule == "off":
        monkeypatch.setattr(graph_pool, "clobbered", lambda clobbers: False)

    def run_a(x):
        return (x * 2 + 1,)

    def run_b(x):
        return (x.sin(),)

    a = graphed.GraphedProgram(run_a, None, torch.device("cpu"))
    b = graphed.GraphedProgram(run_b, None, torch.device("cpu"))
    x = torch.empty(4, 3)
    torch.manual_seed(0)
    before = dict(graphed.counts)
    for i, v in enumerate(torch.randn(16, 4, 3)):
        x.copy_(v)
        (ya,) = a.run((x,))
        # From call 10 on (both graphed), the caller keeps A's result through B's call.
        kept, want = (ya, ya.clone()) if i >= 10 else (None, None)
        del ya
        (yb,) = b.run((x,))
        assert_bitwise(yb, v.sin(), f"call {i}: B's result")
        del yb
        if kept is not None:
            if rule == "off":
                assert not torch.equal(kept, want), "the stand-in's replay of B did not write over A's result"
                return
            assert_bitwise(kept, want, f"call {i}: A's result kept through B's call")
    delta = _delta(before)
    assert a.phase == b.phase == "graphed", (a.phase, b.phase)
    assert b.clobbers, "A's result dead at B's capture is not noted in B's clobbers"
    assert delta["clobbered"] == 1 and delta["copied_out"] == 1, str(delta)


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.usefixtures("cpu_graphs")
def test_a_training_loop_in_a_pool_that_reuses_dead_results_equals_the_full_path(set_to_none, monkeypatch):
    """``test_a_training_loop_under_worst_case_write_sets_equals_the_full_path`` where the pool
    also reuses dead results, each replay writing over every result dead at its capture too.
    Every step equals the full path bit for bit, and every program replays in the last steps."""
    allocator = _Allocator(monkeypatch)
    delta, tail = _a_kept_output_loop(_PoolThatReuses(), set_to_none, monkeypatch)
    assert allocator.given, "no dead result was given back: the test shows nothing"
    assert tail["last"]["graph_replays"] == 5 * 8 and tail["last"]["clobbered"] == 0, (str(tail["last"]), str(delta))


def _a_result_given_back_and_handed_out_again(monkeypatch):
    """A member's result, dead at a ``reclaim`` (given back), then handed out again by its
    graph's replay: alive in memory the allocator sees free. Returns the stand-in allocator, the
    pool, the member, the result's entry and the tensor over it."""
    allocator = _Allocator(monkeypatch)
    pool = graph_pool.for_device(torch.device("cpu"))
    a = _Member((), [torch.arange(64.0)])
    pool.admit(a)
    a.settle()
    (result,) = pool.results
    pool.reclaim()
    assert allocator.given == [result.start] and not result.allocated
    return allocator, pool, a, result, a.pool_results[0].detach()


def test_a_live_result_in_memory_given_back_is_covered_before_the_next_capture(monkeypatch):
    """A result given back while dead and handed out again by its graph's replay lies in memory
    the allocator sees free: ``cover`` takes the free block it lies in (after a block of the same
    size at a lower address, which the allocator's best fit hands out first), so that the
    capture places nothing there; the placeholders are in the next checkpoint and go back at a
    later capture once no live result lies in them. A capture whose write set still meets a
    live result that is not covered is ``exposed``."""
    allocator, pool, _a, result, kept = _a_result_given_back_and_handed_out_again(monkeypatch)  # A held: current
    lower = result.start - 4096
    block = (result.start - 64, result.end + 64)
    allocator.free = [(lower, lower + block[1] - block[0], True), (*block, True),
                      (result.end + 128, result.end + 256, True)]
    assert pool.exposed(((result.start, result.start + 8),))
    pool.cover(_Stream())
    assert allocator.taken == [lower, result.start - 64], "not the block the live result lies in"
    assert result.allocated and not pool.exposed(((result.start, result.start + 8),))
    b = _Member((), [torch.zeros(2)])
    pool.admit(b)  # the checkpoint: the placeholders in it
    b.settle()
    holders = [p for p in pool.results if isinstance(p, graph_pool.Placeholder)]
    assert [p.start for p in holders] == [lower, result.start - 64] and all(p.in_checkpoint for p in holders)
    pool.reclaim()  # the lower placeholder goes back; the one holding A's live result stays
    assert allocator.given[-2:] == [lower, b.storages[0].data_ptr()], \
        "not given back: the lower placeholder, B's result"
    assert [p for p in pool.results if isinstance(p, graph_pool.Placeholder)] == [holders[1]]
    assert holders[1].holds and result.allocated
    del kept


@pytest.mark.parametrize("segment", ["small", "large"])
def test_a_cover_takes_a_block_larger_than_the_small_pools_requests_in_pieces(segment, monkeypatch):
    """A live result in a 1.5 MiB free block: in the allocator's small pool (2 MiB segments,
    requests of at most 1 MiB) taken in pieces from the block's start (after a 1.25 MiB block
    elsewhere, the best fit for the first piece); in the large pool at once. Session 48, run 2:
    asked for whole, the small pool's block was never taken and the capture dropped."""
    allocator, pool, _a, result, kept = _a_result_given_back_and_handed_out_again(monkeypatch)  # A held: current
    mib, small = 1 << 20, segment == "small"
    start = result.start - mib
    other = start - 4 * mib
    allocator.free = [(other, other + 5 * mib // 4, small), (start, start + 3 * mib // 2, small)]
    pool.cover(_Stream())
    want = [other, start, start + mib] if small else [start]
    assert allocator.taken == want and result.allocated, (allocator.taken, want)
    assert not pool.exposed(((result.start, result.end),))
    del kept


@pytest.mark.usefixtures("cpu_graphs")
def test_the_pool_is_released_when_its_last_program_is_freed_with_its_module(monkeypatch):
    """A program graphed in the pool (reusing dead results) and then deleted, no result of it
    kept: the pool is released at once, as ``torch.cuda.empty_cache`` then gives its memory back
    (session 48, run 3: released only at the next ``graphed.free``; a program's ``__del__``
    held its results while it left)."""
    _Allocator(monkeypatch)
    monkeypatch.setattr(graphed, "capture", _PoolThatReuses().capture)
    a = graphed.GraphedProgram(lambda x: (x * 2 + 1,), None, torch.device("cpu"))
    x = torch.randn(4, 3)
    for _ in range(8):
        a.run((x,))
    pool = a.pool
    assert a.phase == "graphed" and pool is not None and pool.results, a.phase
    del a
    gc.collect()
    assert pool._state is None and pool.results == [] and not pool.members, "the pool was not released"


def test_no_pool_is_released_by_a_collection_while_a_capture_is_under_way(monkeypatch):
    """A pool whose last graph left while its result lived, that result gone since: a garbage
    collection releases it, but not one that runs while a program's capture into the pool is
    under way (between its first use of the pool and its ``admit``)."""
    _Allocator(monkeypatch)
    pool = graph_pool.for_device(torch.device("cpu"))
    a = _Member((), [torch.arange(4.0)])
    pool.admit(a)
    a.settle()
    kept = a.pool_results[0].detach()
    a.capture_id = 0
    a.pool_results = a.storages = []
    pool._state = "the last checkpoint"
    pool.leave(a)
    del kept
    assert pool.results and not pool.members
    with graph_pool.capturing():
        gc.collect()
        assert pool._state is not None and pool.results, "released during a capture"
    gc.collect()
    assert pool._state is None and pool.results == [], "not released after the capture"
