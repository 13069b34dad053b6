"""What fuseops' backwards return under ``create_graph=True``: gradients behind a node that
raises if a second backward reaches it (README: double backward raises). The ops' backwards run
kernels and references without recording a graph, so a gradient made under ``create_graph=True``
is a constant to autograd; returned as it is, a second backward through it (a gradient penalty,
a Hessian-vector product) would take its derivatives as zero and say nothing.

torch's ``once_differentiable`` wraps the gradients only where an incoming cotangent requires
grad. A gradient that depends on the forward's tensors through what the backward saved (the
routing weights' ``<dy, expert output>``, every weight gradient) would then come back a constant
(``expert_layer``'s gradients and ``unpermute``'s weights gradient under a plain cotangent).
``once_differentiable`` here wraps whenever the backward runs with grad mode on. The node links
to everything the gradients depend on (``no_second_backward``'s ``links``): linked to nothing,
it would be pruned by a second backward that names its inputs.

With batched cotangents (``is_grads_batched=True``, ``jacobian(vectorize=True)``) the raising
node cannot be attached (torch's older vmap drops the gradients' autograd history; its
``DelayedError`` on a batched tensor crashed the process): ``create_graph=True`` then raises at
once.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch

from fuseops.kernels.autodiff_state import batched_cotangents

MESSAGE = ("fuseops: double backward (create_graph=True, then a backward through these gradients) is not "
           "supported; the ops' backward is not differentiable")


def no_second_backward(grads: tuple, links: tuple = ()) -> tuple:
    """``grads``, each tensor behind one node that raises ``MESSAGE`` if differentiated. The node
    also links to ``links``' tensors that require grad: what the backward read (its cotangents,
    saved tensors, parameters), everything the gradients depend on. A second backward that asks
    for the derivative with respect to one of them (``torch.autograd.grad(..., inputs,
    allow_unused=True)``, ``backward(inputs=...)``, ``gradgradcheck``) reaches the node and
    raises; linked to nothing, the engine would leave the node out and return None, a zero."""
    present = [g for g in grads if isinstance(g, torch.Tensor)]
    if not present:
        return grads
    if batched_cotangents(*present):
        refuse_batched_create_graph()
    linked = [t for t in links if isinstance(t, torch.Tensor) and t.requires_grad]
    err = torch._C._functions.DelayedError(MESSAGE, len(present) + len(linked))
    # The node's outputs alias its inputs (no copy); the links' are dropped.
    wrapped = err(*[g.detach().requires_grad_() for g in present], *linked)
    # One input, one Tensor back (not a tuple): iterated, it would give its rows (a
    # create_graph=True backward with one gradient, torch.func.vjp of a parameterless op).
    wrapped = iter((wrapped,) if isinstance(wrapped, torch.Tensor) else wrapped)
    return tuple(next(wrapped) if isinstance(g, torch.Tensor) else g for g in grads)


def input_links(inputs: tuple) -> tuple:
    """Weak references to the inputs of a Function's forward that require grad, for
    ``no_second_backward``'s links at a ``create_graph=True`` backward (``linked_inputs``). A
    gradient can depend on an input the forward did not save through an intermediate it did save
    (a frozen first Linear's ``z``, the expert layer's permuted rows, a residual input's sum),
    which autograd cannot see. Weak: nothing kept alive, no graph built in the forward (a 0-row
    clone of each unsaved input, tried first, cost its leaf's first graph use there: ~25 us a
    call on the CPU). A saved input stays referenced by the backward's saved tensors. Empty while
    compiling (AOTAutograd refuses a compiled graph's double backward itself)."""
    if torch.compiler.is_compiling():
        return ()
    # A loop, not a generator: no frame resumed per input, every call.
    links = []
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            links.append(weakref.ref(t))
    return tuple(links)


def linked_inputs(refs: tuple) -> tuple:
    """The inputs ``input_links`` referred to, at a ``create_graph=True`` backward; raises where
    one is gone (not saved, so the gradients' dependence on it could not be linked, and a second
    backward would take it as zero)."""
    inputs = tuple(ref() for ref in refs)
    if any(t is None for t in inputs):
        raise RuntimeError(
            "fuseops: create_graph=True through a call whose input (one its ops did not save) is no longer "
            "referenced: the raising node of a second backward cannot be linked to it. Double backward is not "
            "supported; differentiate twice with torch.func (jacrev, hessian), or keep a reference to the input")
    return inputs


def refuse_batched_create_graph() -> None:
    raise RuntimeError(
        "fuseops: create_graph=True with batched cotangents (torch.autograd.grad(..., is_grads_batched=True), "
        "torch.autograd.functional.jacobian / hessian(..., vectorize=True)) is not supported: the ops' backward "
        "is not differentiable; pass create_graph=False, or differentiate twice with torch.func (jacrev, hessian)")


def once_differentiable(backward: Callable) -> Callable:
    """An autograd Function's ``backward`` run without grad; under ``create_graph=True`` its
    gradients behind the raising node (``no_second_backward``), whatever the cotangents, linked
    to the cotangents, the saved tensors and the inputs of ``ctx.input_links``
    (``input_links``, where the forward set them)."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        create_graph = torch.is_grad_enabled()
        if create_graph and batched_cotangents(*grads):
            refuse_batched_create_graph()
        with torch.no_grad():
            out = backward(ctx, *grads)
        if not create_graph:
            return out
        # Read again for the links (create_graph=True only): saved-tensor hooks unpack twice.
        links = (*grads, *ctx.saved_tensors, *linked_inputs(getattr(ctx, "input_links", ())))
        return no_second_backward(out, links) if isinstance(out, tuple) else no_second_backward((out,), links)[0]

    return wrapper
