"""CUDA-graph replay of recorded programs, where a program's host work outlasts its GPU work (issue 20).

A recorded program (``replay.py``) is straight-line Python with fixed shapes. Where its host
path is the bottleneck (the GPU idles between its kernels: small and medium layers), one graph
launch replaces its launches: captured once per program (one input layout), replayed per call.

What a call does, keeping what eager calls guarantee:

- **Inputs.** A slot whose tensor lay at one address over the measured calls (a parameter, an
  activation the allocator keeps placing there) or lies in another graph's results when the program
  is captured is read by the graph where it lies: *pinned*. Nothing is held for it: every call
  checks that its tensor is at that address. Where one moved, the program is captured again at
  once: pinned at its new address if that is another graph's result (its producer was just graphed;
  those stay put) or a parameter given new storage, copied from then on if an activation moved
  between two allocator-placed addresses (it will move again). One that moved out of another
  graph's results (its producer may be between its own graphs) runs the program eagerly; after
  ``MEASURED_CALLS`` such calls in a row the graph is freed and the program measured again, and a
  slot that did so twice is copied from then on. A copied slot has the graph's own buffer, into
  which each call's tensor is copied (the storage range it covers, so any strides copy). A copied
  slot whose tensors come from another graph's results for ``MEASURED_CALLS`` calls in a row (it
  was captured while that graph ran eagerly) is captured again, pinned. Copies from the weight
  cache (a float32 weight's cast under autocast) are asked for before the graph, as a replay asks
  (``replay._DerivedRecorder``), and copied in only when the cache hands out another tensor (after
  the weight changed).
- **Outputs.** A result that is an input, or a view of one, is the call's own input, or the
  same view of it. A result in graph memory goes out as a new tensor over that memory, not a
  copy. The next replay would overwrite it, so a call replays only when no tensor handed out
  by the last replay lives (the storages' use counts, as torch.compile's CUDA-graph trees read
  them); while one does (a micro-batch's saved activations during the next micro-batch's
  forward, an output the caller keeps until the next step reassigns it, a gradient autograd
  kept as ``.grad`` and ``zero_grad(set_to_none=False)`` keeps), the call runs the program
  eagerly, with fresh outputs, and the results found alive go out as copies from then on
  (one device copy each a call; the graph is then timed again against the eager program, step
  3), so that the graph replays under the caller's references. A result kept for good (handed
  out before it was copied) holds the graph's memory: after ``MEASURED_CALLS`` such calls the
  program is captured again, into memory of its own.
- **Memory.** The graphs of a device share one memory pool (``graph_pool.py``): their results
  stay allocated while they live, and each capture's intermediates reuse what earlier captures
  freed. A replay writes where its capture allocated (its write set), so a graph whose write
  set holds a later graph's result that is still alive runs its call eagerly instead (as a
  busy one does: ``counts["clobbered"]``), and after ``MEASURED_CALLS`` such calls in a row is
  captured again, around that result (after ``SHARED_CAPTURES`` such captures, into a private
  pool). Results dead at a capture are given back for it to reuse, and a graph whose write
  set holds such a result runs eagerly while that result lives again; a capture whose memory
  would still meet a live result is dropped unreplayed (``counts["exposed"]``). (Where the
  write set cannot be read, the caller recording the allocator's history or the allocator
  ``cudaMallocAsync``, that graph gets a private pool, holding its intermediates too.)
  A graph in use costs little beyond the eager program's own tensors (its results are the
  activations and gradients the eager calls would make), but one whose shape is no longer
  called keeps its results: a model through several token counts, an evaluation batch, a trial
  never judged because its program was not called again (session 34: SwiGLU H=4096 through
  T=1024, 4096, 16384 held 6 GB of such graphs in private pools). So the graphs of *idle*
  programs (none of the last ``idle_calls()`` calls of any program, and no result alive) may
  hold at most ``MEMORY_FRACTION`` of the device's memory, by their results' bytes: past it,
  each capture frees the oldest idle graphs (their memory goes back to the pool, for the next
  captures), whose programs are measured again if they are called again (within
  ``MAX_CAPTURES``). With no graph left, the pool itself is released.

When a program is graphed is decided per program, by measurement (never by a size rule);
measuring takes no host synchronisation, checking a capture does (step 2):

1. Its first ``MEASURED_CALLS`` replays run as before, each timed on the host (enqueue time)
   and between two CUDA events, read once complete (``Event.query``); calls made before then
   run untimed (the host is ahead of the GPU); where GPU-bound programs may capture too, the
   call after the timed runs waits for them (the capture that follows syncs anyway). A program
   whose GPU span exceeds its shortest enqueue time by ``GPU_BOUND`` is *GPU-bound*: its host
   work is hidden already, so its graph saves host time alone (the host a training loop then has
   for other work) and must not add GPU work. It is captured only where its graph would copy at
   most ``GPU_BOUND_COPIES`` of its inputs' bytes a call (its inputs are parameters, other graphs'
   results, tensors that stay put), else it is measured again (an input's producer may still be
   measuring: its results move until its graph is kept) and stays eager after
   ``MAX_COPY_MEASUREMENTS`` such measurements, as it does for good once its graph is dropped
   (but for an input that left another graph's results: measured afresh, as above), a capture
   again would copy more (an input that moved), a parameter of it is given new storage (one
   gathered afresh each step would have it captured each step) or a result of it outlives its
   next call (copied out from then on: GPU work). The shortest, not the
   median: a host far enough ahead of the GPU waits in its launches for the launch queue to
   drain, and those enqueue times measure the GPU (session 40, call 15: a 4-block GELU T=4096
   H=4096 step, each program 1.5-3.5 ms of GPU work, enqueued in 0.07-0.5 ms until the queue
   filled, then in 0.8-3.2 ms; by the median every program but one was captured, each capture
   syncing, from step 60 on).
2. Otherwise the next call captures. It runs eagerly and finds which inputs (but the
   parameters) the eager run wrote into: those must be pinned (into a copied input the graph
   would write its own copy; the grouped MLP's backward writes dz over the saved z), and are
   restored before every other run of the body (the warm-up, the checking replay). It
   captures, replays once and checks the graph's results, and what it wrote into inputs, equal
   the eager run's bit for bit. These checks read the device (one host synchronisation each),
   once per capture. The call hands out the graph's results: a consumer captured in the same
   step pins them (session 26: handing out the eager ones sent each consumer to capture again,
   in a cascade down a deep stack).
3. ``MEASURED_CALLS`` graph replays are timed the same way. The graph is kept where its
   enqueue time is under ``KEEP`` of the eager program's and the call takes no longer: the
   longer of its enqueue time and GPU span (copies included) within ``GPU_SLACK`` of the eager
   program's longer one; else it is freed, and the program measured afresh and captured once
   more where it is host-bound and this was its first such verdict (its samples are taken in a
   model's first steps, among other programs' captures), eager from the second on. Its GPU
   span counts as at most the eager program's plus its copies' (timed by an event after them):
   the same kernels, whose spans differ between samples by more than ``GPU_SLACK``. (A
   host-bound program's graph may spend on copies the GPU time the host kept idle; a GPU-bound
   program's may not lengthen the GPU's work, which its step waits for.) A graph captured again after its inputs moved is judged against
   the earlier eager samples by its own span; dropped there, the program is measured afresh and
   captured again (new inputs can mean new work: another routing's expert loads), within
   ``MAX_CAPTURES``.

Never graphed: programs recorded under a save receiver (offload), with random ops (a graph would
repeat their draws), writing into an input that moves, or with inputs off the GPU. Calls made
while the stream is being captured (the caller's own CUDA graph, ``make_graphed_callables``) run
the program eagerly. ``FUSEOPS_CUDA_GRAPHS=0`` turns graphs off; ``=host`` graphs only programs
the host bounds (GPU-bound ones stay eager: the rule before session 50); ``=all`` graphs GPU-bound
programs whatever they copy (``GPU_BOUND`` infinite).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fuseops.ops.executor import graph_pool

_MODES = ("0", "1", "host", "all")


def _check_mode(value: str) -> str:
    if value not in _MODES:
        raise ValueError(f"FUSEOPS_CUDA_GRAPHS={value!r}: expected '1' (graphs where the host is the bound, and of "
                         f"GPU-bound programs that copy almost nothing), 'host' (only where the host is the bound), "
                         f"'all' (every program) or '0' (none)")
    return value


def gpu_bound_from_env(value: str) -> float:
    """``GPU_BOUND`` for a ``FUSEOPS_CUDA_GRAPHS`` value: 4.0, or infinity for "all" (every program
    measured is captured: a GPU-bound one then costs only memory and saves only host time, step 3
    judging it as any other)."""
    return float("inf") if _check_mode(value) == "all" else 4.0


def gpu_bound_copies_from_env(value: str) -> float | None:
    """``GPU_BOUND_COPIES`` for a ``FUSEOPS_CUDA_GRAPHS`` value: None for "host" (GPU-bound programs
    stay eager), infinity for "all", else 0.01."""
    mode = _check_mode(value)
    return None if mode == "host" else float("inf") if mode == "all" else 0.01


# The mode, read once at import (a value not among ``_MODES`` raises there).
_MODE = _check_mode(os.environ.get("FUSEOPS_CUDA_GRAPHS", "1"))
ENABLED: bool = _MODE != "0"
MEASURED_CALLS = 3
# A host-bound program's GPU span is its enqueue time plus its last kernels (session 24: 1.1-1.3x
# at T=4096 H=1024, where graphs pay): GPU-bound only well past that. Programs at 2-4x still pay
# in a step (session 25 call 8: the 4-block GELU stack's synced step at T=4096 H=1024 2.27 ms
# with 2.0, four of eight programs eager; 2.00 ms with 4.0, all graphed; T=1024 H=2048 2.55 ->
# 2.09): the step starts with the GPU idle, and a graph also drops the gaps between its kernels.
# Past it a graph only trades memory for host time (session 41, calls 3 and 5, the GELU stack at
# T=16384 H=4096 with every program graphed: 32-40 % less host time a step, the same step time,
# 1.7x the peak reserved memory in private pools; session 46, one shared pool: 1.22x, the backward
# graphs' results, weight gradients among them, staying allocated through the next forward;
# session 50, run 6, where every graph settles: 3,770 against 3,842 MB at GELU T=16384 H=2048,
# host 3.14 against 4.15 ms a step). ``GPU_BOUND_COPIES`` says which such programs make that
# trade; ``FUSEOPS_CUDA_GRAPHS=all`` makes it for all: infinity.
GPU_BOUND = gpu_bound_from_env(_MODE)
# A GPU-bound program is captured where its graph would copy at most this fraction of its inputs'
# bytes a call (None: it stays eager). A program reads its inputs at least once, so such copies
# (a read and a write each) add at most ~2 % to its GPU span, within ``GPU_SLACK``: its graph then
# saves host time for the memory of its results alone. One that would copy more (the experts of
# an MoE composition, whose permuted rows are a fresh tensor each call) stays eager: its copies
# would lengthen the step, and its buffers and the graphs captured and dropped on the way held
# 2.25x the memory under ``all`` (session 50, run 6: OLMoE T=16384, 10,824 against 4,808 MB).
# A GPU-bound graph dropped for any reason but an input that left another graph's results (its
# producer's doing: measured afresh), whose parameters are given new storage, or whose results
# outlive its next call (they would go out as copies), leaves its program eager.
GPU_BOUND_COPIES = gpu_bound_copies_from_env(_MODE)
KEEP = 0.9
# A graph's call against the eager one's, each the longer of enqueue time and GPU span: within the
# GPU clock's drift between the two measurements. Session 47 (call 7): a GPU-bound program at
# T=16384 H=2048 (eager 0.92 ms enqueue, 3.6 ms GPU) was kept with 6 copied slots (3.9 ms) under
# the rule before (GPU span under 1.1x the eager one's), and compiled fuseops ran 7-8 % slower
# than eager there in call 2 (four such graphs).
GPU_SLACK = 1.03
# Captures of one program (pinned inputs that moved free a graph); then it stays eager.
MAX_CAPTURES = 6
# Measurements of a GPU-bound program whose graph would copy too much (``_copies_too_much``);
# then it stays eager.
MAX_COPY_MEASUREMENTS = 3
# Captures again around a later graph's live result (``clobbered``) after which a program's next
# captures go to a private pool, whose memory no other graph shares: two programs each capturing
# into the other's write set could otherwise go on until ``MAX_CAPTURES`` (a CPU stand-in with
# the largest write sets did, in the MoE routing's 48-layer stack).
SHARED_CAPTURES = 2
# The graph memory idle programs may hold, as a fraction of the device's memory (module
# docstring), and the fewest calls of others after which a program is idle (``idle_after``).
MEMORY_FRACTION = 0.05
IDLE_CALLS = 64
# Device types whose programs are graphed. The CPU tests add "cpu", with stand-ins for
# ``capture`` and ``_Timed`` (tests/ops/executor/test_graphed_states.py).
DEVICE_TYPES = frozenset({"cuda"})

# What happened, counted (the tests and benchmarks read them).
counts: dict[str, int] = {"captured": 0, "kept": 0, "graph_replays": 0, "stayed_eager": 0, "dropped": 0,
                          "busy": 0, "moved": 0, "recaptured": 0, "copied_out": 0, "evicted": 0, "clobbered": 0,
                          "exposed": 0}
# Why programs were not graphed, or not any longer (a drop that leaves a program eager), by reason.
refusals: dict[str, int] = {}

_MEASURING, _TRIAL, _GRAPHED, _EAGER = "measuring", "trial", "graphed", "eager"
# Integer dtypes of each element size: results and inputs are compared by their bits (a NaN
# equals itself there).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_side_streams: dict[int, torch.cuda.Stream] = {}
# Addresses of every live graph's results in graph memory: an input found there lies where the
# next call's will (that graph's results stay put), so it is pinned, never copied for good.
# Counted once per graph whose results lie there: a capture may place its results where an
# earlier graph's dead ones lie (graph_pool.py's reuse), and freeing that earlier graph must not
# take the later one's out (session 49, run 11: it did, so the consumers of three recaptured
# producers found their inputs "moved out of graph memory", ran eagerly and were captured again).
_graph_memory: collections.Counter[int] = collections.Counter()
# Programs holding a graph (on trial or graphed), weakly: one freed with its module leaves.
_holding: weakref.WeakSet[GraphedProgram] = weakref.WeakSet()
# Every graph state, weakly (``settling``).
_programs: weakref.WeakSet[GraphedProgram] = weakref.WeakSet()
# Calls of any program so far (``GraphedProgram.last_call``).
_calls = 0
# Numbers each capture kept, from 1 (``GraphedProgram.capture_id``; 0: no graph).
_capture_ids = itertools.count(1)


class Parts:
    """A program split for a graph: ``prologue(*inputs)`` asks the weight cache for its copies
    (``num_derived`` tensors), ``body(*inputs, *copies)`` is every other line."""

    __slots__ = ("body", "num_derived", "prologue", "source")

    def __init__(self, prologue: Callable[..., tuple], body: Callable[..., tuple], num_derived: int,
                 source: str) -> None:
        self.prologue, self.body, self.num_derived, self.source = prologue, body, num_derived, source


def refuse(reason: str) -> None:
    refusals[reason] = refusals.get(reason, 0) + 1


def for_program(program: Any, inputs: Sequence[torch.Tensor | None], not_graphable: str | None,
                parts: Callable[[], Parts | None]) -> GraphedProgram | None:
    """The graph state of a just-recorded ``program`` (``replay.Program``), or None where it
    is never graphed (the module docstring). ``parts``: makes the program's split, if it has one."""
    if not ENABLED:
        return None
    if not_graphable is not None:
        refuse(not_graphable)
        return None
    devices = {t.device for t in inputs if t is not None}
    if len(devices) != 1 or next(iter(devices)).type not in DEVICE_TYPES:
        return None
    return GraphedProgram(program.run, parts(), next(iter(devices)))


def memory_share(device: torch.device, fraction: float) -> float:
    """``fraction`` of ``device``'s memory in bytes (unbounded off the GPU): the graph memory
    budgets here and in ``fuseops.moe.routing_graphs``."""
    if device.type != "cuda":
        return float("inf")
    return fraction * torch.cuda.get_device_properties(device).total_memory


def idle_after(holders: int) -> int:
    """Calls of any holder without one of its own after which one of ``holders`` is idle:
    ``IDLE_CALLS``, or four per holder if more (a step calls each about once). Programs here,
    keys in ``fuseops.moe.routing_graphs``."""
    return max(IDLE_CALLS, 4 * holders)


def budget(device: torch.device) -> float:
    """Bytes the graphs of idle programs on ``device`` may hold (``MEMORY_FRACTION``)."""
    return memory_share(device, MEMORY_FRACTION)


def idle_calls() -> int:
    """Calls of any program without one of its own after which a program is idle."""
    return idle_after(len(_holding))


def held_bytes() -> int:
    """Bytes of results every live graph holds in its pool (the benchmarks report it)."""
    return sum(p.held for p in list(_holding))


def free(device: torch.device | str | None = None) -> int:
    """Free the graphs of every program on ``device`` (any, if None; "cuda" is every CUDA device)
    whose results are not alive, and the device's graph pool once no graph is left in it; their
    programs are measured again if called again.
    The number freed. (What a user calls before an evaluation or a checkpoint, or between
    benchmark cells; the routing's states: ``fuseops.moe.routing_graphs.clear()``.)"""
    want = None if device is None else torch.device(device)
    freed = 0
    for p in list(_holding):
        on = want is None or (p.device.type == want.type and want.index in (None, p.device.index))
        if on and not p.busy():
            p._evict()
            freed += 1
    # A pool whose last graph went while a result of it lived is released once none does.
    for pool in graph_pool.pools():
        pool.release_if_idle()
    return freed


def calls() -> int:
    """Calls of any graph state so far: the clock ``settling`` counts from."""
    return _calls


def settling(since: int) -> int:
    """How many graph states called since ``calls()`` returned ``since`` are still measuring or
    on trial: their next calls time eager runs or replays, and may capture (a host
    synchronisation, step 2). Zero once every program a loop's step calls is graphed or eager
    for good, where a benchmark starts timing and a training loop stops syncing for graphs
    (``benchmarks/_timing.py``'s ``until_graphs_settle``, which also waits out recordings: a
    program recorded in a step is first called in the next). A program measuring that is not
    called again (another input shape's) is not counted."""
    return sum(1 for p in list(_programs) if p.last_call > since and p.phase in (_MEASURING, _TRIAL))


def _free_idle(device: torch.device) -> None:
    """The oldest idle graphs on ``device`` freed while the idle ones hold more than ``budget``."""
    since = idle_calls()
    idle = [p for p in list(_holding) if p.device == device and _calls - p.last_call > since and not p.busy()]
    held, limit = sum(p.held for p in idle), budget(device)
    for p in sorted(idle, key=lambda p: p.last_call):
        if held <= limit:
            return
        held -= p.held
        p._evict()


def _enter_graph_memory(results: Sequence[torch.Tensor]) -> None:
    """A capture's results in graph memory, counted for their graph."""
    _graph_memory.update(t.data_ptr() for t in results)


def _leave_graph_memory(results: Sequence[torch.Tensor]) -> None:
    """A freed graph's results: an address leaves graph memory with its last graph."""
    for t in results:
        address = t.data_ptr()
        if _graph_memory[address] <= 1:
            _graph_memory.pop(address, None)
        else:
            _graph_memory[address] -= 1


def in_graph_memory(t: torch.Tensor) -> bool:
    """Whether ``t`` is a result a live graph hands out (it stays where the graph's replays
    write it: never to be freed or resized by its receiver)."""
    return t.data_ptr() in _graph_memory


def decision(eager: Sequence[tuple[float, ...]], graphed: Sequence[tuple[float, float, float]] | None,
             same_work: bool = True) -> str:
    """From ``(enqueue s, GPU span s, of which copies s)`` samples (``_Timed``; the eager
    program's copy nothing, and may leave the third out): after the eager ones alone, "capture"
    or "eager"; with the graph's too, "keep" or "drop" (the module docstring's steps 1 and 3).
    ``same_work``: whether the eager samples ran the graph's work (not where they were measured
    before its inputs moved)."""
    # The shortest of each: a host that waited for the launch queue measured the GPU's pace, a
    # GPU that waited for the host measured the host's (module docstring, step 1).
    host = min(sample[0] for sample in eager)
    gpu = min(sample[1] for sample in eager)
    if graphed is None:
        return "eager" if gpu > GPU_BOUND * host else "capture"
    # The host time must shrink, and the call must not take longer: a call takes the longer of
    # its host and GPU times. Not the GPU span alone: where the GPU was behind, the eager span
    # was its own work, which a graph cannot shorten (session 24: a rule asking both to shrink
    # freed every backward's graph), and a host-bound program's copies fill GPU time that idled.
    graph_host, graph_gpu = min(h for h, _, _ in graphed), min(g for _, g, _ in graphed)
    if same_work:
        # A graph runs the eager program's kernels and adds its copies: its span is taken as at
        # most the eager one's plus its copies'. Two spans of the same kernels differ by more than
        # GPU_SLACK from noise alone (session 49, run 6: one graph's three replays 1.548-1.727 ms
        # at GELU T=4096 H=4096; run 1, the same cells under FUSEOPS_CUDA_GRAPHS=all: eight
        # graphs dropped, their shortest spans 3-11 % over the eager programs').
        graph_gpu = min(graph_gpu, gpu + min(c for _, _, c in graphed))
    return "keep" if graph_host < KEEP * host and max(graph_host, graph_gpu) < GPU_SLACK * max(host, gpu) else "drop"


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(_BITS[t.element_size()]) if t.is_floating_point() else t


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether ``a`` and ``b`` hold the same bits (a host read of the device)."""
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _span(t: torch.Tensor) -> int:
    """Elements of storage from ``t``'s first element to its last."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0


def _copied_fraction(inputs: Sequence[Any], pinned: set[int]) -> float:
    """The fraction of ``inputs``' bytes (tensors, each the storage range it covers) in the slots
    not ``pinned``: what a graph would copy a call (the weight cache's copies, once a weight
    changes)."""
    sizes = {i: _span(t) * t.element_size() for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)}
    total = sum(sizes.values())
    return sum(b for i, b in sizes.items() if i not in pinned) / total if total else 0.0


def _covering(t: torch.Tensor) -> torch.Tensor:
    """The contiguous run of ``t``'s storage that holds its elements, as a 1-D tensor."""
    return torch.as_strided(t, (_span(t),), (1,), t.storage_offset())


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device.index not in _side_streams:
        _side_streams[device.index] = torch.cuda.Stream(device)
    return _side_streams[device.index]


def capture(body: Callable[..., tuple], static: Sequence[Any], device: torch.device,
            after_warm_up: Callable[[], None],
            pool: graph_pool.SharedPool | None) -> tuple[torch.cuda.CUDAGraph, tuple, graph_pool.Ranges | None]:
    """``body`` on ``static`` captured as a CUDA graph into ``pool``, the results it captured
    (written by each replay) and its write set (``graph_pool.py``); None for the write set where
    the graph went to a private pool instead (``pool`` None, or not ``graph_pool.can_share``). Runs
    once before capturing, on a side stream, so that lazy initialisations happen outside the
    capture, then ``after_warm_up`` (which restores the inputs the body writes into). Raises
    RuntimeError where the capture failed."""
    current, side = torch.cuda.current_stream(device), _side_stream(device)
    side.wait_stream(current)
    graph = torch.cuda.CUDAGraph()
    shared = pool is not None and graph_pool.can_share()
    try:
        with torch.cuda.stream(side):
            body(*static)
            after_warm_up()
            handle = pool.handle() if shared else None
            if shared:
                pool.reclaim()
                pool.cover(side)
            with graph_pool.allocations(pool.device, side) if shared else _no_record() as found:
                graph.capture_begin(pool=handle, capture_error_mode="thread_local")
                try:
                    results = body(*static)
                finally:
                    graph.capture_end()
    finally:
        current.wait_stream(side)
    return graph, results, found.ranges


@contextlib.contextmanager
def _no_record() -> Iterator[graph_pool.Allocations]:
    yield graph_pool.Allocations()


class _Written:
    """The inputs a capture's eager run wrote into (``slots``), by their contents before it
    (``restore``: every run of the body needs them as they came) and after it (the eager
    result, which may be views of them). Empty where the program writes into none."""

    __slots__ = ("after", "before", "inputs", "out", "slots", "want")

    def __init__(self, inputs: Sequence[Any], out: tuple, before: dict[int, torch.Tensor]) -> None:
        self.inputs, self.out, self.before, self.slots = inputs, out, before, set(before)
        self.after = {i: _covering(inputs[i]).clone() for i in before}
        # Results over a written input's memory change with it (``restore``): compared as copies.
        # The others are the eager run's own tensors (a weight gradient: not copied).
        written = {inputs[i].untyped_storage().data_ptr() for i in before}
        self.want = tuple(t.clone() if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in written
                          else t for t in out)

    def _write(self, contents: dict[int, torch.Tensor]) -> None:
        for i, t in contents.items():
            _covering(self.inputs[i]).copy_(t)

    def restore(self) -> None:
        self._write(self.before)

    def eager_result(self) -> tuple:
        """The eager run's result, its written inputs as it left them (a failed capture)."""
        self._write(self.after)
        return self.out

    def differs(self, got: tuple) -> str | None:
        """What of a replay's result, and of the inputs it wrote, differs from the eager run's."""
        k = next((k for k, (a, b) in enumerate(zip(got, self.want)) if not same_bits(a, b)), None)
        if k is not None:
            return f"result {k}"
        return next((f"write into input {i}" for i, t in self.after.items()
                     if not same_bits(_covering(self.inputs[i]), t)), None)


class _Timed:
    """One timed run: its enqueue time and the CUDA events around it (and, in a replay with
    copied slots, one after the copies)."""

    __slots__ = ("copied", "end", "host", "start")

    def __init__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.copied: torch.cuda.Event | None = None
        self.start.record()
        self.host = time.perf_counter()

    def after_copies(self) -> None:
        self.copied = torch.cuda.Event(enable_timing=True)
        self.copied.record()

    def stop(self) -> _Timed:
        self.host = time.perf_counter() - self.host
        self.end.record()
        return self

    def sample(self) -> tuple[float, float, float]:
        """``(enqueue s, GPU span s, of which copies s)``."""
        copies = self.start.elapsed_time(self.copied) / 1e3 if self.copied is not None else 0.0
        return self.host, self.start.elapsed_time(self.end) / 1e3, copies


class GraphedProgram:
    """A recorded program's graph state: measuring, on trial, graphed or eager (the module
    docstring). ``run(inputs)`` is the program's result on ``inputs``."""

    def __init__(self, run: Callable[..., tuple], parts: Parts | None, device: torch.device) -> None:
        self.eager_run = run
        self.parts = parts
        self.body = run if parts is None else parts.body
        self.derived_count = 0 if parts is None else parts.num_derived
        self.device = device
        self.phase = _MEASURING
        self.timed: list[_Timed] = []
        self.eager_samples: list[tuple[float, float]] = []
        # Whether the eager samples were measured before the graph on trial was captured again
        # (``_capture_again`` carries them over): the work may have changed since.
        self.samples_carried = False
        # The last trial's graph samples, kept for the benchmarks to show what a verdict rested on.
        self.graph_samples: list[tuple[float, float]] = []
        self.addresses: list[tuple] = []
        self.captures = 0
        # Whether its last measurement found it GPU-bound (``GPU_BOUND``) where ``GPU_BOUND_COPIES``
        # still let it be captured.
        self.gpu_bound = False
        self.clobber_captures = 0  # captures again around a later graph's live result
        self.copy_measurements = 0  # measurements finding its graph would copy too much
        # A host-bound program's first trial judged slower than its eager program: that
        # measurement's samples and its graph's, pooled with the next trial's (``_judge``); ()
        # once that second judgement is made.
        self.slower_trial: tuple[list, list] | None = None
        # How often each slot's address moved under a graph (weighted: ``_note_move``), and the
        # slots copied from the next capture on.
        self.moves: dict[int, int] = {}
        self.unsettled: set[int] = set()
        # Results (positions among those in graph memory) found alive at a later call: handed out
        # as copies (``_replay``). The program's results keep their order across captures.
        self.copy_out: set[int] = set()
        self.last_call = _calls
        _programs.add(self)
        self._free()

    def __del__(self) -> None:
        # A program freed with its graph (its module gone): its results' addresses are no
        # longer graph memory.
        self._forget_results()

    def _forget_results(self) -> None:
        _leave_graph_memory(getattr(self, "pool_results", ()))
        # Its own references dropped before it leaves: the pool is released where no result of
        # it lives elsewhere (a program freed with its module still holds them in ``__del__``).
        self.pool_results, self.storages, self.alone, self.capture_id = [], [], [], 0
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.leave(self)

    def _free(self) -> None:
        self._forget_results()
        _holding.discard(self)
        # Bytes of its results in graph memory (the budget's measure of what it holds).
        self.held = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        # Its shared pool (None: none, or a private pool), its write set there, and the other
        # graphs' results in that write set that its replay must not write over (``graph_pool.py``).
        self.pool: graph_pool.SharedPool | None = None
        self.writes: graph_pool.Ranges = ()
        self.clobbers: list[graph_pool.Result] = []
        self.capture_id = 0
        self.clobber_calls = 0
        self.buffers: dict[int, torch.Tensor] = {}  # copied slot -> its covering buffer
        self.pinned: list[tuple[int, int]] = []  # (slot, address)
        self.from_graphs: set[int] = set()  # pinned slots captured over another graph's results
        self.derived_last: dict[int, tuple[weakref.ref, int]] = {}
        # The results in graph memory, their storages, and each storage's use count with only
        # this object holding it (a larger count: a handed-out result still lives).
        self.pool_results: list[torch.Tensor] = []
        self.storages: list[Any] = []
        self.alone: list[tuple[int, int]] = []  # (storage handle, use count), after a capture
        self.plan: list[tuple] = []
        self.misses = 0
        self.settling = 0
        self.busy_calls = 0

    def run(self, inputs: Sequence[Any]) -> tuple:
        global _calls
        _calls += 1
        self.last_call = _calls
        outer_capture = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if self.phase is _EAGER or not ENABLED or outer_capture:
            return self.eager_run(*inputs)
        if self.phase is not _MEASURING:
            out = self._replay(inputs)
            if out is not None:
                return out
            if self.phase is not _MEASURING:
                return self.eager_run(*inputs)
        return self._measure(inputs)

    # -- measuring the eager program, then capturing

    def _complete(self, wait: bool = False) -> list[tuple[float, float, float]] | None:
        """The timed runs' samples once all are complete (None before; with ``wait``, once all
        are timed, waiting for the last), and a fresh start."""
        if len(self.timed) < MEASURED_CALLS:
            return None
        if wait:
            self.timed[-1].end.synchronize()
        elif not self.timed[-1].end.query():
            return None
        samples = [t.sample() for t in self.timed]
        self.timed = []
        return samples

    def _measure(self, inputs: Sequence[Any]) -> tuple:
        # Where a GPU-bound program may capture too (``GPU_BOUND_COPIES``), the call after the
        # timed runs waits for the last instead of running on untimed: the capture that follows
        # syncs the host anyway. Session 49, run 14 (fresh processes, GELU / SwiGLU T=4096 H=4096, two
        # rounds): peak reserved 3,130-3,450 MB with the wait, 3,328-5,632 without (the default
        # rule: 3,030 / 3,334), with as many captures either way (15-22 for eight programs).
        samples = self._complete(wait=GPU_BOUND_COPIES is not None)
        if samples is not None:
            self.eager_samples, self.samples_carried = samples, False
            self.gpu_bound = decision(samples, None) == "eager"
            if self.gpu_bound and GPU_BOUND_COPIES is None:
                counts["stayed_eager"] += 1
                self.phase = _EAGER
                return self.eager_run(*inputs)
            return self._capture(inputs)
        if len(self.timed) >= MEASURED_CALLS:
            # The timed runs are not complete yet (the host is ahead of the GPU): untimed, so
            # that a host running far ahead neither piles up events nor samples its waits.
            return self.eager_run(*inputs)
        self.addresses.append(tuple(t.data_ptr() if isinstance(t, torch.Tensor) else None for t in inputs))
        timed = _Timed()
        out = self.eager_run(*inputs)
        self.timed.append(timed.stop())
        return out

    def _stay_eager(self, reason: str) -> None:
        refuse(reason)
        counts["stayed_eager"] += 1
        self.phase = _EAGER
        self._free()
        # A capture that failed its checks may have started its device's pool: released if
        # no graph is in it.
        graph_pool.for_device(self.device).leave(self)

    def _capture(self, inputs: Sequence[Any]) -> tuple:
        """This call's result: the graph's where the capture and its checks pass (step 2), else
        the eager run's."""
        with graph_pool.capturing():
            return self._capture_into_pool(inputs)

    def _capture_into_pool(self, inputs: Sequence[Any]) -> tuple:
        # Pinned: where the measured calls found the slot at one address, or where it lies in
        # another graph's results now (those stay put; its producer was graphed meanwhile).
        pinned = {i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and i not in self.unsettled
                  and (t.data_ptr() in _graph_memory or all(seen[i] == t.data_ptr() for seen in self.addresses))}
        if self._copies_too_much(inputs, pinned):
            return self.eager_run(*inputs)
        # Inputs the program writes into (the grouped MLP's backward writes dz over the saved z,
        # which nothing reads after it): a graph writes them where they lie, as the eager run
        # does, so they must be pinned (into a copied input it would write its own copy).
        # Parameters are not read back (their size).
        checked = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)
                   and not isinstance(t, torch.nn.Parameter)]
        before = {i: _covering(inputs[i]).clone() for i in checked}
        out = self.eager_run(*inputs)
        written = _Written(inputs, out, {i: before[i] for i in checked
                                         if not same_bits(before[i], _covering(inputs[i]))})
        del before
        if not written.slots <= pinned:
            self._stay_eager("a kernel writing into an input that moves")
            return out
        written.restore()
        derived = self.parts.prologue(*inputs) if self.parts is not None else ()
        everything = (*inputs, *derived)
        # The weight cache's copies count too: a training step changes the weights, so every
        # replay after an optimizer step copies them.
        if derived and self._copies_too_much(everything, pinned):
            return written.eager_result()
        self.captures += 1
        static = []
        for i, t in enumerate(everything):
            if t is None or i in pinned:
                # A pinned input: the graph reads the call's tensor where it lies.
                static.append(t)
                if t is not None:
                    self.pinned.append((i, t.data_ptr()))
                    if t.data_ptr() in _graph_memory:
                        self.from_graphs.add(i)
            else:
                buffer = torch.empty(_span(t), dtype=t.dtype, device=t.device)
                buffer.copy_(_covering(t))
                self.buffers[i] = buffer
                static.append(buffer.as_strided(t.shape, t.stride(), 0))
                if i >= len(inputs):
                    self.derived_last[i] = (weakref.ref(t), t._version)
        pool = graph_pool.for_device(self.device) if self.clobber_captures < SHARED_CAPTURES else None
        try:
            graph, results, writes = capture(self.body, static, self.device, written.restore, pool)
        except RuntimeError as why:
            self._stay_eager(f"the capture failed ({type(why).__name__}: {str(why)[:120]})")
            return written.eager_result()
        if writes is not None and pool.exposed(writes):
            # Its memory over a live result the cover could not keep it from (``graph_pool.py``):
            # dropped unreplayed, measured again.
            counts["exposed"] += 1
            refuse("a capture over a live result")
            del graph, results
            self._measure_again()
            return written.eager_result()
        self.graph = graph
        planned = self._plan(results, static)
        del results, static
        if not planned:
            return written.eager_result()
        if writes is not None:
            pool.in_order()
        graph.replay()
        differs = written.differs(self._outputs(everything))
        if differs is not None:
            self._stay_eager(f"the graph's {differs} differs from the eager run's")
            return written.eager_result()
        self.capture_id = next(_capture_ids)
        if writes is not None:
            self.pool, self.writes = pool, writes
            pool.admit(self)
        # Only this object holds the graph's results now: their storages' use counts alone.
        self.alone = [(s._cdata, torch._C._storage_Use_Count(s._cdata)) for s in self.storages]
        _enter_graph_memory(self.pool_results)
        counts["captured"] += 1
        self.phase = _TRIAL
        self.held = sum({s.data_ptr(): s.nbytes() for s in self.storages}.values())
        _holding.add(self)
        _free_idle(self.device)
        # The graph's results, not the eager run's (equal bit for bit): a consumer captured in
        # this step then pins them where every replay writes them, where the eager results lay
        # only this once (its next call would find its input moved and capture again).
        return self._outputs(everything)

    def _copies_too_much(self, everything: Sequence[Any], pinned: set[int]) -> bool:
        """Whether this GPU-bound program's graph would copy more than ``GPU_BOUND_COPIES`` of
        its inputs' bytes a call (its graph would add GPU work): measured again, uncaptured, until
        ``MAX_COPY_MEASUREMENTS`` found so, then eager from now on. An input whose producer was
        itself measuring or on trial moved between the measured calls (session 54, run 7: the
        MoE composition's experts' backward, its rows' gradient from the unpermute backward), and
        lies in that producer's graph by a later measurement."""
        if not self.gpu_bound or _copied_fraction(everything, pinned) <= GPU_BOUND_COPIES:
            return False
        self.copy_measurements += 1
        if self.copy_measurements < MAX_COPY_MEASUREMENTS and self.captures < MAX_CAPTURES:
            self._measure_again()
        else:
            self._stay_eager("a GPU-bound program whose graph would copy its inputs")
        return True

    def _plan(self, results: Sequence[torch.Tensor | None], static: list[torch.Tensor | None]) -> bool:
        """How each result is handed out: None, an input, a view of an input, a new empty
        tensor, or graph memory. False (eager from now on) where two results share graph memory."""
        storages = {t.untyped_storage().data_ptr(): i for i, t in enumerate(static) if t is not None and t.numel()}
        held: dict[int, int] = {}
        for r in results:
            if r is None:
                self.plan.append(("none",))
                continue
            slot = next((i for i, t in enumerate(static) if t is r), None)
            if slot is not None:
                self.plan.append(("input", slot))
                continue
            if not r.numel():
                # No memory to share (every empty storage is at address 0, as empty inputs' are).
                self.plan.append(("empty", tuple(r.shape), r.stride(), r.dtype))
                continue
            storage = r.untyped_storage().data_ptr()
            if storage in storages:
                slot = storages[storage]
                delta = r.storage_offset() - static[slot].storage_offset()
                self.plan.append(("view", slot, tuple(r.shape), r.stride(), delta))
                continue
            if id(r) not in held:
                if any(p.untyped_storage().data_ptr() == storage for p in self.pool_results):
                    self._stay_eager("two results sharing graph memory")
                    return False
                held[id(r)] = len(self.pool_results)
                self.pool_results.append(r)
                self.storages.append(r.untyped_storage())
            self.plan.append(("graph", held[id(r)]))
        return True

    def disown(self) -> None:
        """Its results in graph memory over storages that do not own it (``graph_pool.py``, the
        shared pool's ``admit``): the allocator sees their memory free once the graph's own
        tensors are dropped, and the pool gives it to a later capture once they are dead."""
        for k, r in enumerate(self.pool_results):
            storage = r.untyped_storage()
            unowned = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), r.device, storage.nbytes())
            self.pool_results[k] = torch.empty(0, dtype=r.dtype, device=r.device).set_(
                unowned, r.storage_offset(), r.shape, r.stride())
            self.storages[k] = unowned

    def _outputs(self, everything: Sequence[Any]) -> tuple:
        # A result in graph memory goes out as a new tensor over it: the next replay overwrites
        # it, which ``_replay`` allows only once every such tensor is gone.
        out = []
        for entry in self.plan:
            kind = entry[0]
            if kind == "graph":
                result = self.pool_results[entry[1]]
                out.append(result.clone() if entry[1] in self.copy_out else result.detach())
            elif kind == "input":
                out.append(everything[entry[1]])
            elif kind == "view":
                _, slot, shape, stride, delta = entry
                base = everything[slot]
                out.append(torch.as_strided(base, shape, stride, base.storage_offset() + delta))
            elif kind == "empty":
                _, shape, stride, dtype = entry
                out.append(torch.empty_strided(shape, stride, dtype=dtype, device=self.device))
            else:
                out.append(None)
        return tuple(out)

    # -- replaying the graph

    def _replay(self, inputs: Sequence[Any]) -> tuple | None:
        """The graph's results on ``inputs``; None where it cannot run now: a result of its
        last replay still lives (the caller runs the program eagerly; such results go out as
        copies from then on), or a pinned input left another graph's results (the same, and after
        ``MEASURED_CALLS`` such calls in a row the graph is freed and the program measured again).
        A pinned input that moved elsewhere makes this call capture the program again (its result
        is then the new graph's)."""
        if self.busy():
            counts["busy"] += 1
            if self.gpu_bound:
                # Its results would go out as copies: GPU work its graph must not add (the keep
                # rule's span cap counts its input copies only; session 50). A micro-batch's
                # saved activations, an output kept until the next step, a ``.grad`` kept.
                self._stay_eager("a GPU-bound program whose results outlive its next call")
                return None
            alive = self._alive()
            # Kept past the next call (an output bound until the next step reassigns it, a
            # gradient kept as ``.grad`` across steps): such results go out as copies from now
            # on, so that the graph replays under them. Results handed out before then and kept
            # for good hold this graph's memory: a new capture gets memory of its own.
            if alive - self.copy_out:
                counts["copied_out"] += len(alive - self.copy_out)
                self.copy_out |= alive
                if self.phase is _GRAPHED:
                    # The copies cost GPU time (a micro-batch's saved activations can be large):
                    # timed again against the eager program.
                    self.phase, self.timed = _TRIAL, []
            self.busy_calls += 1
            if self.busy_calls >= MEASURED_CALLS and self.captures < MAX_CAPTURES:
                return self._capture_again(inputs, self._pinned_slots())
            return None
        self.busy_calls = 0
        derived = self.parts.prologue(*inputs) if self.parts is not None else ()
        everything = (*inputs, *derived) if derived else inputs
        moved = [slot for slot, address in self.pinned if everything[slot].data_ptr() != address]
        if moved:
            counts["moved"] += 1
            if self.gpu_bound and any(isinstance(everything[s], torch.nn.Parameter) for s in moved):
                # A parameter given new storage would be pinned there by a capture again: its
                # graph saves host time alone, not worth a capture after every such move (a
                # parameter gathered afresh each step, FSDP-style, would capture each step).
                self._stay_eager("a GPU-bound program whose parameters moved")
                return None
            # Into other graphs' results, or a parameter given new storage (``param.data = t``):
            # pinned there (they stay put). An activation from one allocator-placed address to
            # another: copied from now on (it will move again). Either way the program is captured
            # again now; a slot that left graph memory waits (``_note_move``).
            stays = {s for s in moved if everything[s].data_ptr() in _graph_memory
                     or isinstance(everything[s], torch.nn.Parameter)}
            fresh = {s for s in moved if s not in stays and s not in self.from_graphs}
            if self.captures < MAX_CAPTURES and stays | fresh == set(moved):
                self.unsettled |= fresh
                return self._capture_again(inputs, self._pinned_slots() - fresh)
            self.misses += 1
            if self.misses >= MEASURED_CALLS:
                for slot in moved:
                    self._note_move(slot, everything[slot].data_ptr())
                if self.captures >= MAX_CAPTURES:
                    self._drop("a graph whose inputs moved after its last capture")
                else:
                    # Its producer runs eagerly now, perhaps only while it is measured again: a
                    # judgement of the producer, not of this program, which is measured afresh
                    # too, GPU-bound or not (captured again only where its graph copies little).
                    self._drop("a graph whose inputs left other graphs' memory", gpu_bound_for_good=False)
            return None
        self.misses = 0
        settled = self._settled(everything) if self.buffers else set()
        if settled:
            return self._capture_again(inputs, settled | self._pinned_slots())
        if self.phase is _TRIAL:
            self._judge()
            if self.phase is _EAGER or self.phase is _MEASURING:
                return None
        if self.clobbers and graph_pool.clobbered(self.clobbers):
            # A later graph's result that lies where this replay writes is alive: eager, as for
            # a busy graph. Kept for good, it makes this graph capture again, around it.
            counts["clobbered"] += 1
            self.clobber_calls += 1
            if self.clobber_calls >= MEASURED_CALLS and self.captures < MAX_CAPTURES:
                self.clobber_captures += 1
                return self._capture_again(inputs, self._pinned_slots())
            return None
        self.clobber_calls = 0
        timed = _Timed() if self.phase is _TRIAL and len(self.timed) < MEASURED_CALLS else None
        for slot, buffer in self.buffers.items():
            t = everything[slot]
            last = self.derived_last.get(slot)
            if last is not None:
                if last[0]() is t and last[1] == t._version:
                    continue
                self.derived_last[slot] = (weakref.ref(t), t._version)
            buffer.copy_(_covering(t))
        if timed is not None and self.buffers:
            timed.after_copies()
        if self.pool is not None:
            self.pool.in_order()
        self.graph.replay()
        out = self._outputs(everything)
        counts["graph_replays"] += 1
        if timed is not None:
            self.timed.append(timed.stop())
        return out

    def _alive(self) -> set[int]:
        """The results of the last replay (positions in graph memory) that still live."""
        use_count = torch._C._storage_Use_Count
        return {k for k, (handle, alone) in enumerate(self.alone) if use_count(handle) != alone}

    def busy(self) -> bool:
        """Whether a result of the last replay still lives: the next call would run eagerly.
        (Asked before every call: a loop that stops at the first, not ``_alive``'s set.)"""
        use_count = torch._C._storage_Use_Count
        for handle, alone in self.alone:
            if use_count(handle) != alone:
                return True
        return False

    def _pinned_slots(self) -> set[int]:
        return {slot for slot, _ in self.pinned}

    def _capture_again(self, inputs: Sequence[Any], keep: set[int]) -> tuple:
        """This call's result, the program captured again at once with the slots ``keep`` pinned
        at this call's addresses (the others copied): ``_replay``'s moved inputs and ``_settled``'s.
        The measurement carries over, and a kept graph's verdict where the same slots are pinned
        (only addresses differ; a newly copied slot adds a copy: judged again)."""
        counts["recaptured"] += 1
        same_slots = keep == self._pinned_slots()
        verdict = self.phase
        self._free()
        self.timed = []
        self.samples_carried = True
        self.addresses = [tuple(t.data_ptr() if i in keep else None for i, t in enumerate(inputs))]
        out = self._capture(inputs)
        if verdict is _GRAPHED and same_slots and self.phase is _TRIAL:
            self.phase = _GRAPHED
        return out

    def _note_move(self, slot: int, new: int) -> None:
        """Whether a pinned slot that moved is copied from the next capture on. Into another
        graph's results: pinned again (those stay put). From one allocator-placed address to
        another: copied at once (such a tensor moves again: a fresh ``dy`` of ``.sum()``, an
        activation whose producer's memory changed). Out of graph memory: its producer went
        eager, perhaps only between its own graphs: copied if it moves a second time."""
        if new in _graph_memory:
            return
        self.moves[slot] = self.moves.get(slot, 0) + (1 if slot in self.from_graphs else 2)
        if self.moves[slot] >= 2:
            self.unsettled.add(slot)

    def _settled(self, everything: Sequence[Any]) -> set[int]:
        """The copied inputs that came from other graphs' results (they were captured while those
        ran eagerly) for ``MEASURED_CALLS`` calls in a row, once they have: pinning them saves
        their copies. Empty otherwise."""
        found = {slot for slot in self.buffers if slot < len(everything) - self.derived_count
                 and slot not in self.unsettled and everything[slot].data_ptr() in _graph_memory}
        self.settling = self.settling + 1 if found else 0
        return found if self.settling >= MEASURED_CALLS and self.captures < MAX_CAPTURES else set()

    def _drop(self, reason: str, gpu_bound_for_good: bool = True) -> None:
        """Its graph freed for ``reason`` (inputs that left graph memory, a verdict against it):
        measured afresh, or eager from now on where it was captured ``MAX_CAPTURES`` times or,
        with ``gpu_bound_for_good``, is GPU-bound (its graph only ever saved host time); then
        ``reason`` is among the ``refusals``."""
        if self.gpu_bound and gpu_bound_for_good:
            self._drop_for_good(f"{reason} (GPU-bound)")
            return
        counts["dropped"] += 1
        if self.captures >= MAX_CAPTURES:
            refuse(f"{reason} (GPU-bound)" if self.gpu_bound else reason)
        self._measure_again()

    def _drop_for_good(self, reason: str) -> None:
        """Its graph freed, and the program eager from now on, for ``reason``."""
        refuse(reason)
        counts["dropped"] += 1
        counts["stayed_eager"] += 1
        self.phase = _EAGER
        self._free()

    def _measure_again(self) -> None:
        """Its graph freed, measured afresh at its next calls (eager where it was captured
        ``MAX_CAPTURES`` times): a graph dropped, or evicted (``_evict``)."""
        self.phase = _MEASURING if self.captures < MAX_CAPTURES else _EAGER
        self.eager_samples, self.addresses, self.timed = [], [], []
        self._free()

    def _evict(self) -> None:
        """Its graph freed while no result of it lives (``free``, ``_free_idle``)."""
        counts["evicted"] += 1
        self._measure_again()

    def _judge(self) -> None:
        """Keep or free the graph once its timed replays are complete (step 3)."""
        samples = self._complete()
        if samples is None:
            return
        self.graph_samples = samples
        eager, graph = self.eager_samples, samples
        if self.slower_trial and not self.samples_carried:
            # Its second judgement: on both trials' samples, the shortest of twice as many.
            eager, graph = eager + self.slower_trial[0], graph + self.slower_trial[1]
            self.slower_trial = ()
        if decision(eager, graph, same_work=not self.samples_carried) == "keep":
            counts["kept"] += 1
            self.phase = _GRAPHED
        elif self.samples_carried:
            # Eager samples from before the inputs moved: the work may have changed with them (a
            # new cell's routing; session 27: the experts' GPU span grew by a third from uniform to
            # skewed routing, and the graph was dropped for a span the eager program had too).
            # Judged again against a fresh measurement.
            self._drop("a graph judged slower than its program measured before its inputs moved")
        elif not self.gpu_bound and self.slower_trial is None:
            # A host-bound program's samples are taken in a model's first steps, while its other
            # programs measure and capture: session 54 (run 3) saw the MoE composition's unpermute
            # backward (the first program of its backward) at 88-193 us of host eager and 88-127
            # us graphed, where its graph replays in 17-40 us at steady state, and the drop took
            # the experts' backward after it (their input left graph memory). Measured and
            # captured once more, and judged on both trials' samples, before it is eager for good.
            self.slower_trial = (self.eager_samples, samples)
            self._drop("a graph judged slower than its eager program")
        else:
            self._drop_for_good("a graph judged slower than its eager program")
