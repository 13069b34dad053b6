"""A ``Sequential`` under ``torch.compile`` as two custom operators that run the eager executor.

Traced op by op, a compiled ``Sequential`` runs each op's torch references and our kernels'
custom operators one launcher at a time: its compiled step cost 0.75-1.11x torch.compile's
(session 28, dense stack, H100) and its recorded and graphed programs (``replay.py``,
``graphed.py``), what makes the eager executor fast where the host is the bound, never ran.
Here the whole call is one operator each way, ``fuseops::plan_forward`` and
``fuseops::plan_backward``, inside an autograd Function that dynamo traces
(``_CompiledPlan``): their implementations are the eager executor's bodies (``forward_body``,
``backward_body``), which record, replay and graph per input layout as eager calls do.

What crosses between the two operators. The forward returns the call's outputs, then each
tensor the backward reads (activations, then the records' own tensors) that is neither one of
its inputs nor one of its outputs: an operator's results may not alias its arguments, so those
go by position (``Layout.carried``). The records' other fields are the same every call of one
trace: they are kept per trace (``_Entry.templates``) and filled with each call's tensors.

How each operator knows its call. Dynamo cannot hand an operator Python objects, so each trace
gets an integer (``_new_entry``, a constant of the trace) naming an ``_Entry``: what the trace
depends on besides tensors (``describe``: the ops' classes and settings, guarded, and the
parameters' tying; not the module, so blocks compiled one by one share one graph), a Sequential
so described (the template, held weakly), and what the forward's fake implementation derived
from it and the fake tensors: the plan, the op contexts, the layout above. The fake
implementations run the traced executor on fake tensors (the ops' own fake paths), the
template's ops reading the fake parameters. A real call runs the eager executor with the ops of
the Sequential owning its parameters (``_running``), each Sequential with its own copy of the
entry's ``Prepared`` run (its own recorded and graphed programs); parameters of no Sequential
(``torch.func.functional_call``) are read where given. A real call whose tensors fall otherwise
than the trace's did (an input saved where the trace saved a new tensor, a record field of
another value) raises: it never reads a wrong tensor.

An entry lives as long as the process (a compiled graph names it by number, and nothing tells
when the graph is gone); its copies per Sequential, with their programs and CUDA graphs, live as
long as their Sequential.

Where it applies (``applies``): no module hooks on the ops (they run as modules), no quantized
recipe (their scaling state is per call), two-dimensional inputs and tensor extra inputs only
(a saved view of an input could not be named), ops whose outputs are never their input and
whose records hold no shapes (``BasicOp.compiled_as_operator``), not under ``torch.export`` (an
exported program must not name this process's entries) nor torch.func transforms, and not on the
CPU (``OPERATORS_ON_CPU``). Elsewhere the Sequential is traced op by op as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.node
from torch.nn.utils.stateless import _reparametrize_module

from fuseops.fuser import build_plan, plan_config
from fuseops.kernels.custom_op import fuseops_op
from fuseops.ops.contract import Saved
from fuseops.ops.executor import plain_autograd, replay, saved_state
from fuseops.ops.executor.execute import Plan, check_chain, current_autocast, make_contexts, split_extra_inputs
from fuseops.ops.executor.function import (
    RunState,
    backward_body,
    forward_body,
    forward_ops,
    non_view_outputs,
    run_backward,
)
from fuseops.ops.executor.prepared import Prepared, flat_parameters, forward_without_grad, parameter_slots, prepare
from fuseops.ops.executor.save_notice import set_receiver
from fuseops.ops.executor.saved_state import (
    Unfilled,
    fill_records,
    filled,
    record_templates,
    record_tensor_fields,
    record_tensors,
)

# Every Sequential (weakly): a trace finds one of its settings here (``_new_entry``) and a
# real call the one owning its parameters (``_running``).
_modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_entry_ids = itertools.count()
# Per trace (``_new_entry``), what its operators' calls need.
_entries: dict[int, _Entry] = {}
# A parameter's id -> the Sequential owning it, as last found (checked before use).
_owners: dict[int, weakref.ref] = {}

# Reusable: entering it does nothing.
_NO_CONTEXT = contextlib.nullcontext()

# Where a tensor the backward reads comes from: the forward's input k, its output k, the
# earlier carried tensor k, or its k-th new result after the outputs.
_INPUT, _OUTPUT, _REPEAT, _NEW = 0, 1, 2, 3


@dataclass(frozen=True)
class Layout:
    """The forward operator's results as a trace saw them: ``num_outputs`` outputs, then the new
    carried tensors; ``carried`` says, per tensor the backward reads (the activations, then the
    records' tensor fields), where it is; ``num_activations`` of them are activations."""

    num_outputs: int
    # The forward's arguments before its parameters (x and the extra input tensors).
    num_inputs: int
    num_activations: int
    carried: tuple[tuple[int, int], ...]
    # Per result: its dtype and number of dims (a real call is checked against them).
    results: tuple[tuple[torch.dtype, int], ...]
    # ``record_tensor_fields`` of the trace's records: the carried tensors after the activations.
    fields: tuple[tuple[int, str], ...]
    # ``carried`` split for a real call's check (``_new_carried``): the positions of the new
    # tensors, and ``(position, kind, k)`` of each other one.
    new_at: tuple[int, ...] = ()
    same_at: tuple[tuple[int, int, int], ...] = ()


@dataclass
class _Entry:
    # The trace's ``describe``, and a Sequential so described: the fake implementations run
    # its ops (found again when it is freed: one found may be garbage not yet collected).
    description: tuple
    template: weakref.ref
    prep: Prepared | None = None
    layout: Layout | None = None
    # ``record_templates`` of the trace's records, positions counted among the records' tensors.
    templates: list[tuple[Saved | None, tuple]] = field(default_factory=list)
    # Per gradient the backward operator returns (inputs, then parameters): whether it is one
    # (else an empty tensor stands for None).
    present: tuple[bool, ...] = ()
    # The ``Prepared`` runs (one per Sequential, held weakly: each lives as long as its
    # Sequential) whose records were compared with ``templates``.
    checked: list[weakref.ref] = field(default_factory=list)
    # Per Sequential running this trace's graph, its ``_Runner``: its own copy of ``prep`` (its
    # own recorded and graphed programs, as each Sequential has eagerly).
    runners: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)


@dataclass
class _Runner:
    """How one Sequential runs a trace's real calls: its ops, its own copy of the trace's
    ``Prepared`` run, and where its ops hold the parameters (``held``: per parameter slot, the
    op's ``_parameters``, the name and the position among the call's parameters), which a
    call's parameters are checked against before use."""

    ops: list[torch.nn.Module]
    prep: Prepared
    held: tuple[tuple[dict, str, int], ...]
    # Per recorded program of ``prep`` a real call found checked (by id, with a weak reference
    # that tells the program from a later one of the same id; held weakly, so that a program
    # its layouts dropped frees its CUDA graph): the positions among its operator's results (the
    # forward's outputs, the backward's gradients) that alias an argument and go out as copies.
    # A program's results alias its arguments, and hold None, at the same places every call (a
    # CUDA-graph replay hands them out alike), so its later calls skip the checks
    # (``_forward_results``, ``_gradients``).
    checked: dict[int, tuple[weakref.ref, tuple[int, ...]]] = field(default_factory=dict)

    def holds(self, params: Sequence[torch.Tensor]) -> bool:
        return _holds(self.held, params)


def register(module: torch.nn.Module) -> None:
    """Make ``module`` findable by its settings and parameters (a ``Sequential`` when made)."""
    _modules.add(module)


def describe(module: torch.nn.Module, ops: Sequence[torch.nn.Module]) -> tuple:
    """What a trace of ``module`` depends on besides tensors: fusing or not, each op's class and
    settings (its ``settings_key``), and which of its parameters are one tensor (tied). Traced,
    each part is guarded."""
    _, _, slots = parameter_slots(ops)
    tying = tuple([i for op_slots in slots for i in op_slots.values()])
    return module.fuse, tuple([op.settings_key for op in ops]), tying


@torch.compiler.assume_constant_result
def _new_entry(description: tuple) -> int:
    """A fresh entry for one trace, its template a Sequential described so: a constant of the
    trace (not the module: a graph of blocks compiled one by one is shared by all of them)."""
    entry_id = next(_entry_ids)
    _entries[entry_id] = _Entry(description, weakref.ref(_described(description)))
    return entry_id


def _described(description: tuple) -> torch.nn.Module:
    module = next((m for m in list(_modules) if describe(m, _ops(m)) == description), None)
    if module is None:
        raise RuntimeError("fuseops: a compiled graph ran after every Sequential of its settings was freed")
    return module


@torch.compiler.assume_constant_result
def _layout_of(entry_id: int) -> Layout:
    """What the forward's fake implementation found, read after it ran in this trace."""
    return _entries[entry_id].layout


@torch.compiler.assume_constant_result
def _present_of(entry_id: int) -> tuple[bool, ...]:
    return _entries[entry_id].present


# On the CPU a compiled Sequential is traced op by op: there the operators' bodies, the eager
# executor's, run the kernels' torch references one aten op at a time, while traced those
# references reach Inductor, which fuses them as it fuses torch.nn's (session 63, this CPU, the
# quickstart's 4-block stack fwd+bwd at T=256 H=128: 11.7 ms a step traced, 18.0 as the two
# operators, torch.compile of the torch.nn twin 12.3). The operators' tests set it.
OPERATORS_ON_CPU = False


def applies(ops: Sequence[torch.nn.Module], x: torch.Tensor, extra_inputs: Sequence[Any], recipe: Any) -> bool:
    """Whether this traced call runs as the two operators (the module docstring's conditions)."""
    return (recipe is None and x.dim() == 2 and all(isinstance(e, torch.Tensor) for e in extra_inputs)
            and (x.device.type != "cpu" or OPERATORS_ON_CPU)
            and all(op.compiled_as_operator for op in ops) and not plain_autograd.parametrized(ops)
            and not _exporting()
            and not torch._C._are_functorch_transforms_active())


def _exporting() -> bool:
    """Whether torch.export traces: its flag read as a constant of the trace (torch 2.11's dynamo
    folds ``torch.compiler.is_exporting()`` to True under torch.compile too: device call 3 of
    session 29)."""
    return getattr(torch.compiler, "_is_exporting_flag", False)


def call(module: torch.nn.Module, ops: Sequence[torch.nn.Module], x: torch.Tensor,
         extra_inputs: Sequence[torch.Tensor], grad_enabled: bool) -> Any:
    """The traced call: ``y`` or ``(y, *extra_outputs)``, as ``Sequential.forward`` returns."""
    tensors = [x]
    extra_map = []
    for e in extra_inputs:
        k = next((i for i, t in enumerate(tensors) if t is e), len(tensors))
        if k == len(tensors):
            tensors.append(e)
        extra_map.append(k)
    tensors += parameter_slots(ops)[0]
    requires_grad = [grad_enabled and t.requires_grad for t in tensors]
    entry_id = _new_entry(describe(module, ops))
    args = (entry_id, extra_map, requires_grad, grad_enabled, current_autocast(x))
    if any(requires_grad):
        outputs = _CompiledPlan.apply(*args, *tensors)
    else:
        outputs = _plan_forward(entry_id, tensors, *args[1:])
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


class _CompiledPlan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, entry_id, extra_map, requires_grad, grad_enabled, autocast, *tensors):
        results = _plan_forward(entry_id, list(tensors), extra_map, requires_grad, grad_enabled, autocast)
        layout = _layout_of(entry_id)
        outputs = results[:layout.num_outputs]
        carried = []
        for kind, k in layout.carried:
            if kind == _INPUT:
                carried.append(tensors[k])
            elif kind == _OUTPUT:
                carried.append(outputs[k])
            elif kind == _REPEAT:
                carried.append(carried[k])
            else:
                carried.append(results[layout.num_outputs + k])
        # The parameters too (the backward reads their dtypes; a recorded backward takes them),
        # not the inputs: those the backward reads are among the carried tensors.
        ctx.save_for_backward(*carried, *tensors[layout.num_inputs:])
        ctx.entry_id = entry_id
        ctx.num_carried = len(carried)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        carried, params = saved[:ctx.num_carried], saved[ctx.num_carried:]
        out = _plan_backward(ctx.entry_id, list(carried), list(params), list(grads))
        present = _present_of(ctx.entry_id)
        return (None, None, None, None, None, *[g if p else None for g, p in zip(out, present)])


@contextlib.contextmanager
def _compiling() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` true while a fake implementation runs the traced
    executor: it is within torch.compile, and outside it (``torch.library.opcheck``) the ops
    must take their traced paths too (no host reads of fake tensors)."""
    if torch.compiler.is_compiling() or not hasattr(torch.compiler, "_is_compiling_flag"):
        yield
        return
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = False


def _reparametrized(ops: Sequence[torch.nn.Module], param_slots: Sequence[dict[str, int]],
                    params: Sequence[torch.Tensor]) -> contextlib.ExitStack:
    """The ops reading ``params`` (the operator's arguments; per op, ``param_slots`` names each
    parameter's position) as their parameters."""
    stack = contextlib.ExitStack()
    for op, slots in zip(ops, param_slots):
        if slots:
            stack.enter_context(_reparametrize_module(op, {n: params[i] for n, i in slots.items()}))
    return stack


def _fresh_all(results: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``results``, each copied where it is an argument or a view of one (an operator's results
    may not alias its arguments: a gradient passed straight through, ``dx = dy``). The
    arguments and their bases are collected once a call, not scanned again per result."""
    owners = {id(a) for a in tensors}
    owners.update(id(a._base) for a in tensors if a._base is not None)
    out = []
    for t in results:
        base = t._base
        out.append(t.clone() if id(t if base is None else base) in owners else t)
    return out


def _template(entry: _Entry) -> torch.nn.Module:
    module = entry.template()
    if module is None:
        module = _described(entry.description)
        entry.template = weakref.ref(module)
    return module


def _held(ops: Sequence[torch.nn.Module], prep: Prepared) -> tuple[tuple[dict, str, int], ...] | None:
    """``_Runner.held`` of ``ops`` for ``prep``'s parameter slots; None where they are not
    ``prep``'s ops (another number of them)."""
    if len(ops) != len(prep.param_slots):
        return None
    return tuple((op._parameters, name, i) for op, slots in zip(ops, prep.param_slots) for name, i in slots.items())


def _holds(held: tuple[tuple[dict, str, int], ...], params: Sequence[torch.Tensor]) -> bool:
    """Whether each slot of ``held`` (``_Runner.held``) holds its parameter among ``params``."""
    for where, name, i in held:
        if where.get(name) is not params[i]:
            return False
    return True


def _owns(ops: Sequence[torch.nn.Module], prep: Prepared, params: Sequence[torch.Tensor]) -> bool:
    """Whether ``ops`` hold ``params`` where the trace's ops held its parameters."""
    held = _held(ops, prep)
    return held is not None and _holds(held, params)


def _running(entry: _Entry, params: Sequence[torch.Tensor]
             ) -> tuple[list[torch.nn.Module], Prepared, bool, dict | None]:
    """``(ops, prep, reparametrize, checked)`` of a real call: the ops of the Sequential whose
    parameters these are (a graph may serve every block of its settings), with its own copy of
    the trace's ``Prepared`` run and its runner's ``checked``; where no Sequential's are
    (``torch.func.functional_call`` under compile), the template's ops reading ``params``, and
    no ``checked`` (every call checks)."""
    prep = entry.prep
    if not params:
        return _ops(_template(entry)), prep, False, None
    known = _owners.get(id(params[0]))
    module = known() if known is not None else None
    runner = entry.runners.get(module) if module is not None else None
    if runner is not None and runner.holds(params):
        return runner.ops, runner.prep, False, runner.checked
    if module is None or not _owns(_ops(module), prep, params):
        module = next((m for m in list(_modules) if _owns(_ops(m), prep, params)), None)
        if module is None:
            return _ops(_template(entry)), prep, True, None
        _owners[id(params[0])] = weakref.ref(module)
    # The Sequential's first call of this trace, or its ops changed since (a replaced child, a
    # parameter moved between Sequentials): its runner is made again, keeping its programs (its
    # own: the runner found first may be another Sequential's, where the parameter was before).
    runner = entry.runners.get(module)
    ops = _ops(module)
    own = runner.prep if runner is not None else dataclasses.replace(
        prep, layouts=replay.Layouts() if prep.layouts is not None else None)
    runner = entry.runners[module] = _Runner(ops, own, _held(ops, prep))
    return ops, own, False, runner.checked


def _ops(module: torch.nn.Module) -> list[torch.nn.Module]:
    return list(module._modules.values())


def _prepare_trace(entry: _Entry, tensors: Sequence[torch.Tensor], extra_map: Sequence[int],
                   requires_grad: Sequence[bool], grad_enabled: bool, autocast: torch.dtype | None) -> Prepared:
    """The trace's ``Prepared`` run, as the traced executor makes it, from fake tensors: under
    the grad mode and autocast the traced call found, on stand-ins that need grad as its tensors
    did (inside an operator, grad mode, autocast and ``requires_grad`` read otherwise)."""
    module = _template(entry)
    ops = _ops(module)
    device_type = tensors[0].device.type
    unique, _, slots = parameter_slots(ops)
    # The parameters too: the template may be another Sequential of these settings, whose
    # parameters are of other dtypes, devices, or need grad otherwise.
    standins = [t.detach().requires_grad_(rg) if t.is_floating_point() else t.detach()
                for t, rg in zip(tensors, requires_grad)]
    num_inputs = len(tensors) - len(unique)
    x, extra_inputs = standins[0], [standins[k] for k in extra_map]
    with (torch.set_grad_enabled(grad_enabled), _reparametrized(ops, slots, standins[num_inputs:]),
          torch.autocast(device_type, dtype=autocast, enabled=autocast is not None)):
        per_op = split_extra_inputs(ops, extra_inputs)
        specs = check_chain(ops, x, per_op)
        plan = build_plan(ops, plan_config(x, None, grad_enabled), per_op) if module.fuse else Plan.unfused(ops)
        ctxs = make_contexts(ops, x, per_op, recipe=None, grad_enabled=grad_enabled, input_specs=specs)
        return prepare(plan, ops, ctxs, x, extra_inputs, flat_parameters(ops), kept=True)


def _carried(outputs: Sequence[torch.Tensor], activations: Sequence[torch.Tensor], fields: Sequence[torch.Tensor],
             tensors: Sequence[torch.Tensor]) -> tuple[list[tuple[int, int]], list[torch.Tensor]]:
    """Where each tensor the backward reads lies (``Layout.carried``; the activations, then the
    records' ``fields``), and the new ones."""
    wanted = [*activations, *fields]
    where: list[tuple[int, int]] = []
    new: list[torch.Tensor] = []
    for n, t in enumerate(wanted):
        k = next((i for i, a in enumerate(tensors) if a is t), None)
        if k is not None:
            where.append((_INPUT, k))
            continue
        k = next((i for i, o in enumerate(outputs) if o is t), None)
        if k is not None:
            where.append((_OUTPUT, k))
            continue
        k = next((i for i in range(n) if wanted[i] is t), None)
        if k is not None:
            where.append((_REPEAT, k))
            continue
        where.append((_NEW, len(new)))
        new.append(t)
    return where, _fresh_all(new, tensors)


def _new_carried(layout: Layout, outputs: Sequence[torch.Tensor], activations: list[torch.Tensor], records: Any,
                 tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A real call's new carried tensors, each other one checked to lie where the trace's did
    (else the backward would read another tensor)."""
    if len(activations) != layout.num_activations:
        raise RuntimeError(_differs(f"{len(activations)} activations against the trace's {layout.num_activations}"))
    wanted = _wanted(layout, activations, records)
    for n, kind, k in layout.same_at:
        if not _same(wanted[n], tensors[k] if kind == _INPUT else outputs[k] if kind == _OUTPUT else wanted[k]):
            raise RuntimeError(_differs(f"saved tensor {n} is not where the trace's lay"))
    new = [wanted[n] for n in layout.new_at]
    for t, (dtype, dim) in zip([*outputs, *new], layout.results):
        if t.dtype != dtype or t.dim() != dim:
            raise RuntimeError(_differs(f"a {t.dim()}-dim {t.dtype} result where the trace's was {dim}-dim {dtype}"))
    return new


def _wanted(layout: Layout, activations: list[torch.Tensor], records: Any) -> list[torch.Tensor]:
    """What the backward reads of a real call: its activations, then the records' tensor fields."""
    return [*activations, *record_tensors(records, layout.fields)] if layout.fields else activations


def _checked_for(checked: dict | None, program: Any) -> tuple[int, ...] | None:
    """What ``checked`` (a ``_Runner``'s, or None) holds for ``program`` (None: not checked yet,
    or no program ran): the positions of its results to copy."""
    if checked is None or program is None:
        return None
    seen = checked.get(id(program))
    return seen[1] if seen is not None and seen[0]() is program else None


def _copied(results: Sequence[torch.Tensor], at: tuple[int, ...]) -> list[torch.Tensor]:
    """``results`` with those ``at`` these positions copied (``_Runner.checked``)."""
    return [t.clone() if i in at else t for i, t in enumerate(results)] if at else list(results)


def _copied_at(raw: Sequence[Any], fresh: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The positions ``_fresh_all`` copied: where ``fresh`` holds another tensor than ``raw``."""
    return tuple(i for i, (r, f) in enumerate(zip(raw, fresh)) if r is not None and r is not f)


def _same(t: torch.Tensor, u: torch.Tensor) -> bool:
    """The same tensor, or one over the same memory alike (a replayed CUDA graph hands out each
    result as a tensor of its own, a result repeated among them too)."""
    return t is u or (t.data_ptr() == u.data_ptr() and t.shape == u.shape and t.stride() == u.stride()
                      and t.dtype == u.dtype)


def _differs(what: str) -> str:
    return (f"fuseops: a compiled Sequential's call saved otherwise than its trace did ({what}); "
            f"run it eagerly and report this")


def _forward_results(entry: _Entry, tensors: Sequence[torch.Tensor], *, fake: bool) -> list[torch.Tensor]:
    """The forward operator's results: the outputs, then the new carried tensors."""
    params = list(tensors[entry.prep.num_inputs:])
    ops, prep, reparametrize, checked = (_ops(_template(entry)), entry.prep, True, None) if fake else _running(
        entry, params)
    state = RunState(prep, ops, prep.extra_args, params)
    with _reparametrized(ops, prep.param_slots, params) if reparametrize else _NO_CONTEXT:
        if not prep.needs_backward:
            if fake:
                outputs = forward_ops(state, tensors, None, True)[0]
            else:
                flat = [tensors[a.index] for a in prep.extra_args]
                outputs = forward_without_grad(prep, ops, tensors[0], flat, params)
            return _fresh_all(outputs, tensors)
        if fake:
            outputs, activations, records = forward_ops(state, tensors, None, True)
            outputs = non_view_outputs(outputs, tensors)
        else:
            # No save receiver hears of them (offloading's): the compiled graph saves them,
            # through saved-tensor hooks as any compiled graph's, and not all (some it has).
            previous = set_receiver(None)
            try:
                outputs, activations, records = forward_body(state, tensors, notice=True, checked_params=False,
                                                             fill=False)
            finally:
                set_receiver(previous)
    program = state.replayed
    seen = _checked_for(checked, program)
    if seen is not None:
        # This program's results were checked at an earlier call (``_Runner.checked``).
        wanted = _wanted(entry.layout, activations, records)
        return [*_copied(outputs, seen), *[wanted[n] for n in entry.layout.new_at]]
    raw, outputs = outputs, _fresh_all(outputs, tensors)
    if fake:
        fields = record_tensor_fields(records)
        where, new = _carried(outputs, activations, [getattr(records[i], name) for i, name in fields], tensors)
        templates = record_templates(records, 0)
        _refuse_symbolic(templates)
        entry.layout = Layout(len(outputs), prep.num_inputs, len(activations), tuple(where),
                              tuple((t.dtype, t.dim()) for t in [*outputs, *new]), tuple(fields),
                              tuple(n for n, (kind, _) in enumerate(where) if kind == _NEW),
                              tuple((n, kind, k) for n, (kind, k) in enumerate(where) if kind != _NEW))
        entry.templates = templates
        return [*outputs, *new]
    new = _new_carried(entry.layout, outputs, activations, records, tensors)
    if not any(ref() is prep for ref in entry.checked):
        # Once per Sequential: its records' other fields are the trace's (each call's are).
        if record_templates(filled(records), 0) != entry.templates:
            raise RuntimeError(_differs("the records' fields (settings, saved shapes)"))
        entry.checked.append(weakref.ref(prep))
    if checked is not None and program is not None:
        checked[id(program)] = (weakref.ref(program), _copied_at(raw, outputs))
    return [*outputs, *new]


def _refuse_symbolic(templates: list) -> None:
    """A record field that depends on the trace's sizes cannot be kept for later calls."""
    for saved, _ in templates:
        for name, value in (saved.__dict__.items() if saved is not None else ()):
            values = value if isinstance(value, (tuple, list)) else (value,)
            if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in values):
                raise RuntimeError(f"fuseops: {type(saved).__name__}.{name} depends on the input's size; its op "
                                   f"must set compiled_as_operator = False")


@fuseops_op("plan_forward(int entry, Tensor[] tensors, int[] extra_map, bool[] requires_grad, bool grad_enabled, "
            "ScalarType? autocast) -> Tensor[]", recorded=False)
def _plan_forward(entry_id, tensors, extra_map, requires_grad, grad_enabled, autocast):
    return _forward_results(_entries[entry_id], tensors, fake=False)


@torch.library.register_fake("fuseops::plan_forward")
def _(entry_id, tensors, extra_map, requires_grad, grad_enabled, autocast):
    entry = _entries[entry_id]
    with _compiling():
        entry.prep = _prepare_trace(entry, tensors, extra_map, requires_grad, grad_enabled, autocast)
        return _forward_results(entry, tensors, fake=True)


def _gradients(entry: _Entry, carried, params, grads, *, fake: bool) -> list[torch.Tensor]:
    """The backward operator's results: per argument of the forward (inputs, then parameters)
    its gradient, an empty tensor where it has none."""
    layout = entry.layout
    params = list(params)
    if fake:
        _stand_in_main_grads(params)
    ops, prep, reparametrize, checked = (_ops(_template(entry)), entry.prep, True, None) if fake else _running(
        entry, params)
    state = RunState(prep, ops, prep.extra_args, params)
    activations = carried[:layout.num_activations]
    # A replayed backward reads only the records' tensors (``backward_body``); the trace's fills them.
    records = (fill_records if fake else Unfilled)(entry.templates, carried[layout.num_activations:])
    dy, extra_output_grads = grads[0], tuple(grads[1:])
    with _reparametrized(ops, prep.param_slots, params) if reparametrize else _NO_CONTEXT:
        if fake:
            out = run_backward(state, records, activations, dy, extra_output_grads, True)[1:]
            entry.present = tuple(g is not None for g in out)
        else:
            # Grad mode off, as the engine runs a backward: an operator's results are not
            # differentiated again (a compiled graph's backward never is).
            # (The engine runs a compiled backward with grad mode off already, unless
            # ``create_graph``: the context only where it is on.)
            with saved_state.functional(), torch.no_grad() if torch.is_grad_enabled() else _NO_CONTEXT:
                out = backward_body(state, records, activations, dy, extra_output_grads)[1:]
    program = state.replayed
    seen = _checked_for(checked, program)
    if seen is None and any(g is None and p for g, p in zip(out, entry.present)):
        raise RuntimeError("fuseops: a compiled Sequential's backward gave no gradient where its trace did; "
                           "run it eagerly and report this")
    raw = [g if g is not None else dy.new_empty(0) for g in out]
    if seen is not None:
        return _copied(raw, seen)
    # A gradient passed straight through (``dx = dy``) is the only one that can be an argument.
    fresh = _fresh_all(raw, grads)
    if checked is not None and program is not None:
        checked[id(program)] = (weakref.ref(program), _copied_at(raw, fresh))
    return fresh


def _stand_in_main_grads(params: Sequence[torch.Tensor]) -> None:
    """Give each fake parameter a fake float32 ``main_grad`` of its shape: an op with
    ``accumulate_into_main_grad`` reads it in the fake backward (the fake parameters carry none;
    each compiled Sequential with the flag failed there, session 37). The real call adds into the
    buffer the real parameter holds when it runs."""
    for p in params:
        if p.is_floating_point() and getattr(p, "main_grad", None) is None:
            p.main_grad = p.new_empty(p.shape, dtype=torch.float32)


# ``batched``: cotangents batched by torch's older vmap (``is_grads_batched=True``) reach it too,
# and ``backward_body`` runs the references on them (the vmap has no fallback for tensor lists).
@fuseops_op("plan_backward(int entry, Tensor[] carried, Tensor[] params, Tensor[] grads) -> Tensor[]",
            recorded=False, batched=True)
def _plan_backward(entry_id, carried, params, grads):
    return _gradients(_entries[entry_id], carried, params, grads, fake=False)


# Never dead code, though none of its results be read: with accumulate_into_main_grad a weight's
# gradient goes into its main_grad, none is returned, and where no input needs one either the
# backward's results all go unused (session 37: the compiled graph dropped the call, and the
# main_grads stayed zero). The buffers are the parameters' attributes, read when it runs.
torch.fx.node.has_side_effect(_plan_backward)


@torch.library.register_fake("fuseops::plan_backward")
def _(entry_id, carried, params, grads):
    with _compiling():
        return _gradients(_entries[entry_id], carried, params, grads, fake=True)
