"""CUDA graphs for the MoE routing's kernel calls (issue 20: the host path).

``permute`` and ``unpermute``, forward and backward, each launch two to four small kernels
(count, scan, rows, gather / scatter) whose host path (~70-250 us a call on an H100 host,
session 26's ``benchmarks.host_trace --part moe``) outlasts their GPU work at small and medium
token counts; ``expert_layer``'s forward and backward (the whole layer, routing to combine) go
through the same states, its forward in permute's place. Each call signature (the shapes,
strides, dtypes and device of its tensors, and its static arguments) gets
``graphed.GraphedProgram`` states, which decide by measurement whether to replay the call as a
CUDA graph, with the rules and guarantees of recorded programs (``fuseops/ops/executor/graphed.py``:
results equal the eager run's bit for bit and are never overwritten while they live; inputs pinned
where they stay put, else copied). The results then lie in graph memory, where the experts'
programs pin them.

A model's MoE layers of one shape call with one signature, and a graph's results serve one call
at a time, so each layer needs states of its own. ``permute`` takes the first state of its
signature whose last results are all gone (graph memory by its storages' use counts, eager results
by weak references, so that layers part from their first step) (in training the first layer's ``x_sorted`` and
``row_map`` are saved for its backward while the second layer permutes, so each layer meets its
own state); the other three calls follow the state that made their ``row_map`` (the layer's
permute, whether its results lie in graph memory or were made eagerly), so that they pin that
layer's tensors, or copy them where its permute runs eagerly. (Before session 57 only a row map in
graph memory named its state: the calls of layers whose permute stayed eager shared one key, which
every call of a graphed layer dropped, so that an 8-layer stack made and captured states afresh
every step, 3.3 captures a step on the H100, never settling; ``tests/moe/test_routing_graphs.py``.)
Where the layers' calls share a state (permute's results already gone when the next layer permutes:
inference), its pinned inputs move between calls and the state captures again until
``graphed.MAX_CAPTURES``, then runs eagerly.

Graph memory is bounded: a state's graph keeps its call's results between steps, where eager
calls free them within the step (at Qwen3's shape and 16384 tokens a layer's ``x_sorted`` and
``dy_sorted`` are 0.5 GB each; an expert layer's backward holds its weight gradients, 1.2 GB at
Qwen3's shape). A state is made only while the states that may hold graph memory keep within
``MEMORY_FRACTION`` of the device's memory (counted from each signature's results, so one state a
signature may go past it). Where a new state would pass it, the keys not called for a while (idle:
none of the last ``idle_calls()`` calls, and no result of theirs alive) are dropped first, oldest
first, freeing their graphs (their memory goes back to the device's shared graph pool,
``fuseops/ops/executor/graph_pool.py``): a model that moved on to other shapes (another token count,
an evaluation batch, the next benchmark cell) gets graphs again. Without idle keys enough, further
calls run eagerly. (Before, states of shapes no longer called held the budget for good. By their
results' sizes, ~1.2 GB of weight gradients per Qwen3 backward state against a 4 GB budget on an
H100, session 33's sizes run, one process over Qwen3's, OLMoE's and Mixtral's cells, likely ran out
of it during Qwen3's second token count: its expert layer's enqueue doubled from there on.)

Every eager run of a call (measured, eager for good, capturing, or without a state at all) goes
through the program recorded for its inputs' layout (``op_programs.call``, keyed by the call's name
and static values): the launchers' Python runs on a layout's first two calls only.

Under ``torch.compile`` the calls reach these states from custom operators (``routing_ops.py``, and
``expert_layer_steps.py`` for the whole layer): a compiled model replays the graphs an eager one does.

Not graphed: calls under saved-tensor hooks (offloading: a saved result in graph memory would
stay allocated in graph memory), while torch.compile traces and under torch.func (the caller runs the
traceable ops instead), and with ``FUSEOPS_CUDA_GRAPHS=0``.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fuseops.ops.executor import graphed, op_programs, replay

# Keys kept (the oldest dropped beyond): a key is a signature and, but for permute, the permute
# state it follows, so a model has about three per MoE layer and shape (a 48-layer model 145).
# States per key: permute's one per layer, up to this many (further layers' calls run eagerly).
MAX_KEYS = 4096
MAX_STATES = 64
# Addresses of row maps, by the permute state that made them (bounded: the oldest forgotten past it).
MAX_OWNED = 1024
# The graph memory the states may hold, as a fraction of the device's memory (module docstring).
MEMORY_FRACTION = 0.05


class _Entry:
    """One key's states; where its next call starts looking for a free one (in a steady loop the
    layers call in the same order, so the first state looked at is the free one: not a scan of
    every layer's state per call); per state, the storages of its last eager results, weakly
    (``_in_use``); and the bytes of one call's results (``_held``), from its first call."""

    __slots__ = ("eager", "last", "next", "result_bytes", "states")

    def __init__(self) -> None:
        self.states: list[graphed.GraphedProgram] = []
        self.next = 0
        self.eager: list[list[StorageWeakRef]] = []
        self.result_bytes = 0
        # The call count (``_calls``) at its last call.
        self.last = 0

    def _in_use(self, index: int) -> bool:
        """Whether a result of the state's last call still lives: in graph memory (``busy``), or
        handed out by an eager run (measuring, eager for good, a busy call)."""
        eager = self.eager[index]
        return self.states[index].busy() or (bool(eager) and any(not ref.expired() for ref in eager))

    def held(self) -> int:
        """Bytes its states may hold in graph memory: a call's results for each not eager for good."""
        return self.result_bytes * sum(s.phase != "eager" for s in self.states)

    def idle_since(self, calls: int) -> bool:
        """Whether no call of this key came in the last ``calls`` calls and none of its
        results lives (its graphs can go)."""
        return _calls - self.last > calls and not any(self._in_use(i) for i in range(len(self.states)))

    def free(self) -> int | None:
        """The index of the first state not in use, from ``next`` on, or None."""
        count = len(self.states)
        for i in range(self.next, self.next + count):
            if not self._in_use(i % count):
                return i % count
        return None


# The key (owner, signature) is hashed once a call: a signature hashes a tuple per tensor.
_states: dict[tuple, _Entry] = {}
# The state that made each row map, by its address (graph memory or not): the last call made there.
# Weak: a state dropped with its key frees its graph.
_owners: dict[int, weakref.ref] = {}
# Bytes of one call's results, by signature (from its first call): a new key's first state is
# budgeted with them (``_held`` counts each key's own, which a clearing of this bound keeps).
_result_bytes: dict[tuple, int] = {}
# Calls through the states so far (``_Entry.last``).
_calls = 0


def _budget(device: torch.device) -> float:
    return graphed.memory_share(device, MEMORY_FRACTION)


def _held() -> int:
    """Bytes the states may hold in graph memory: those not eager for good."""
    return sum(entry.held() for entry in _states.values())


def _drop(key: tuple) -> None:
    _states.pop(key, None)


def idle_calls() -> int:
    """Calls without one of its own after which a key is idle (``graphed.idle_after``: a step
    calls each live key about once to twice, so an idle key missed two steps or more)."""
    return graphed.idle_after(len(_states))


def _room(size: int, device: torch.device) -> bool:
    """Whether a new state of ``size`` result bytes fits the budget, after dropping idle keys
    (oldest first) as far as it takes."""
    budget = _budget(device)
    held = _held()
    if held + size <= budget:
        return True
    calls = idle_calls()
    idle = sorted((key for key, entry in _states.items() if entry.idle_since(calls)), key=lambda k: _states[k].last)
    for key in idle:
        held -= _states[key].held()
        _drop(key)
        if held + size <= budget:
            return True
    return False


def _signature(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def applies(device: torch.device) -> bool:
    """Whether a call on ``device`` now goes through a graph state (the module docstring's "Not
    graphed" says when not)."""
    return (graphed.ENABLED and device.type in graphed.DEVICE_TYPES and not torch.compiler.is_compiling()
            and torch._C._autograd._top_saved_tensors_default_hooks(False) is None)


def _recorded(name: str, static: tuple, run: Callable[..., tuple]) -> Callable[..., tuple]:
    """``run`` through the program recorded for its inputs' layout (``op_programs.call``, keyed by
    the call's name and static values, which fix what ``run`` does): an eager run, and a graph
    state's capture, re-issue its launches without the launchers' Python (40-80 us a launcher on
    the H100 host, session 28) where the host is not the bound and no graph is kept."""
    key = (name, static)
    return lambda *inputs: op_programs.call(key, run, inputs)


def call(name: str, run: Callable[..., tuple], inputs: tuple[torch.Tensor | None, ...], static: tuple = (),
         row_map: torch.Tensor | None = None) -> tuple:
    """``run(*inputs)``: a tuple of tensors computed from ``inputs`` and the ``static`` values
    (which ``run`` binds, and which name the signature with ``name``), through a graph state.
    ``row_map``: the call's row map, for every call but those that make it (permute's, and
    expert_layer's forward): their third result."""
    global _calls
    device = inputs[0].device
    if not torch.compiler.is_compiling():
        run = _recorded(name, static, run)
    if not applies(device):
        return run(*inputs)
    owner = None
    if row_map is not None:
        owner_ref = _owners.get(row_map.data_ptr())
        owner = None if owner_ref is None else owner_ref()
    # And the global settings a graph holds (its GEMMs' F32_DOT, the aten kernels deterministic mode picks).
    signature = (name, static, *map(_signature, inputs), replay.global_state())
    key = (owner, *signature)
    _calls += 1
    entry = _states.get(key)
    if entry is None:
        if len(_states) >= MAX_KEYS:
            _drop(next(iter(_states)))
        entry = _states[key] = _Entry()
    entry.last = _calls
    index = entry.free()
    if index is None:
        size = _result_bytes.get(signature, 0)  # unknown before the signature's first call
        if len(entry.states) >= MAX_STATES or not _room(size, device):
            out = run(*inputs)
            return out if row_map is not None else _made_by(None, out)
        entry.states.append(graphed.GraphedProgram(run, None, device))
        entry.eager.append([])
        index = len(entry.states) - 1
    entry.next = index + 1
    state = entry.states[index]
    out = state.run(inputs)
    if not entry.result_bytes:
        entry.result_bytes = sum(t.nbytes for t in out if isinstance(t, torch.Tensor))
        if signature not in _result_bytes:
            if len(_result_bytes) >= MAX_KEYS:
                _result_bytes.clear()
            _result_bytes[signature] = entry.result_bytes
    if state.busy():
        # Its results lie in graph memory (a capture or a replay; eager results are never busy).
        entry.eager[index] = []
    else:
        entry.eager[index] = [StorageWeakRef(t.untyped_storage()) for t in out
                              if isinstance(t, torch.Tensor) and t.numel()]
    return out if row_map is not None else _made_by(state, out)


def _made_by(state: graphed.GraphedProgram | None, out: tuple) -> tuple:
    """``out``, the result of a call that made a row map (its third result): that row map's calls
    follow ``state`` from now on (None: a call without a state, past the budget; an earlier row
    map at its address named another). (Calls where the states do not apply leave ``_owners``
    alone: a stale owner splits keys, nothing worse, and their tensors may have no storage to
    read an address from, fake ones under tracing.)"""
    if out[2].numel():  # (an empty one lies at 0)
        address = out[2].data_ptr()
        _owners.pop(address, None)  # re-inserted last: the dict's order is the calls' order
        if state is not None:
            if len(_owners) >= MAX_OWNED:
                _forget_oldest_owners()
            _owners[address] = weakref.ref(state)
    return out


def _forget_oldest_owners() -> None:
    """The oldest quarter of ``_owners`` forgotten: the row maps of calls made longest ago, gone
    by now where ``MAX_OWNED`` exceeds the row maps a step keeps alive. (Not all of them: clearing
    every entry in the middle of a step sent the consumers of that step's live row maps to states
    of their own, made afresh; on the CPU an 8-layer loop's eager row maps passed 24 addresses
    within 30 steps.)"""
    for address in list(itertools.islice(_owners, max(1, len(_owners) // 4))):
        del _owners[address]


def clear() -> None:
    """Forget every state (their graphs and graph memory are freed with them)."""
    _states.clear()
    _owners.clear()
    _result_bytes.clear()


def states() -> dict[tuple, list[Any]]:
    """The graph states by key, ``(owner, name, static, *input signatures,
    replay.global_state())`` (tests and benchmarks read their phases)."""
    return {key: entry.states for key, entry in _states.items()}
