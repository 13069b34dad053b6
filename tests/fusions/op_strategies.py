"""Hypothesis strategies that build any basic op, so that a fusion's pattern can be
instantiated from its declaration alone (no per-fusion test code).

``BUILDERS`` maps each concrete op class to ``build(draw, in_features, widths, chain)
-> OpSpec`` (``widths`` draws the output width of ops that choose one; ``chain`` is a
dict shared by the ops of one chain, for choices they must agree on); a
pattern element ``OpMatch(types, where)`` is drawn from the concrete subclasses of
``types`` that have a builder, filtered by ``where``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import assume
from hypothesis import strategies as st

from fuseops import ops
from fuseops.fusions.fusion import OpMatch
from tests.ops import declared_ops

# Feature sizes: 1, tile non-multiples and a tile multiple; small for the interpreter.
FEATURES = st.sampled_from([1, 2, 3, 8, 17, 32, 40])


@dataclass
class OpSpec:
    op: ops.BasicOp
    out_features: int
    # Each makes one extra input from (leading shape, in_features, dtype, device,
    # shared) where ``shared`` is one dict per example, so that ops can share an input.
    extra_inputs: list[Callable[..., Any]] = field(default_factory=list)


def _residual(lead, features, dtype, device, shared):
    return torch.randn(*lead, features, dtype=dtype, device=device)


def _probs(lead, features, dtype, device, shared):
    return torch.rand(math.prod(lead), dtype=torch.float32, device=device)


def _split_sizes(groups: int, form: str):
    """Random sizes summing to the row count: empty groups, sometimes all rows in one."""

    def make(lead, features, dtype, device, shared):
        key = ("split", groups, form)
        if key not in shared:
            rows = math.prod(lead)
            if torch.rand(()) < 0.25:
                sizes = [0] * groups
                sizes[int(torch.randint(groups, ()))] = rows
            else:
                cuts = torch.sort(torch.randint(0, rows + 1, (groups - 1,))).values.tolist()
                sizes = [b - a for a, b in zip([0] + cuts, cuts + [rows])]
            shared[key] = sizes if form == "list" else torch.tensor(sizes, device=device)
        return shared[key]

    return make


def _grouped_linear(draw, n, widths, chain):
    # GroupedLinears of one chain share their group count and split sizes.
    if "groups" not in chain:
        chain["groups"] = draw(st.sampled_from([1, 2, 4]))
        chain["split form"] = draw(st.sampled_from(["list", "device tensor"]))
    groups, form = chain["groups"], chain["split form"]
    out = draw(widths)
    op = ops.GroupedLinear(groups, n, out, bias=draw(st.booleans()))
    return OpSpec(op, out, [_split_sizes(groups, form)])


def _linear(draw, n, widths, chain):
    out = draw(widths)
    return OpSpec(ops.Linear(n, out, bias=draw(st.booleans())), out)


def _gated(cls):
    def build(draw, n, widths, chain):
        scaled = draw(st.booleans())
        op = cls(interleaved=draw(st.booleans()), scaled=scaled)
        return OpSpec(op, n // 2, [_probs] if scaled else [])

    return build


def _plain(cls, **kwargs):
    return lambda draw, n, widths, chain: OpSpec(cls(**kwargs), n)


BUILDERS: dict[type, Callable] = {
    ops.Linear: _linear,
    ops.GroupedLinear: _grouped_linear,
    ops.Bias: lambda draw, n, widths, chain: OpSpec(ops.Bias(n), n),
    ops.ReLU: _plain(ops.ReLU),
    ops.GELU: lambda draw, n, widths, chain: OpSpec(ops.GELU(approximate=draw(st.sampled_from(["none", "tanh"]))), n),
    ops.SiLU: _plain(ops.SiLU),
    ops.SReLU: _plain(ops.SReLU),
    ops.Sigmoid: _plain(ops.Sigmoid),
    ops.SwiGLU: _gated(ops.SwiGLU),
    ops.GeGLU: _gated(ops.GeGLU),
    ops.ReGLU: _gated(ops.ReGLU),
    ops.SReGLU: _gated(ops.SReGLU),
    ops.ClampedSwiGLU: _gated(ops.ClampedSwiGLU),
    # Declared as a user declares an activation: every fusion that takes the shipped ones takes them.
    declared_ops.XReLU: _plain(declared_ops.XReLU),
    declared_ops.XReGLU: _gated(declared_ops.XReGLU),
    ops.LayerNorm: lambda draw, n, widths, chain: OpSpec(ops.LayerNorm(n, zero_centered_gamma=draw(st.booleans())), n),
    ops.RMSNorm: lambda draw, n, widths, chain: OpSpec(ops.RMSNorm(n, zero_centered_gamma=draw(st.booleans())), n),
    ops.AddExtraInput: lambda draw, n, widths, chain: OpSpec(ops.AddExtraInput(), n, [_residual]),
    ops.MakeExtraOutput: _plain(ops.MakeExtraOutput),
    ops.Identity: _plain(ops.Identity),
    ops.Quantize: lambda draw, n, widths, chain: OpSpec(
        ops.Quantize(forward=draw(st.booleans()), backward=draw(st.booleans())), n
    ),
}


def register_builder(cls: type, build: Callable) -> None:
    """Let a test module add builders for ops that land later (grouped, quantized)."""
    BUILDERS[cls] = build


def _concrete(types: tuple[type, ...]) -> list[type]:
    found = []
    stack = list(types)
    while stack:
        cls = stack.pop()
        if cls in BUILDERS and cls not in found:
            found.append(cls)
        stack.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__name__)


def needs_even_input(cls: type) -> bool:
    return issubclass(cls, ops.GatedActivation)


@st.composite
def op_chain(draw, pattern: tuple[OpMatch, ...]) -> tuple[int, list[OpSpec]]:
    """``(in_features, specs)`` for a chain of ops matching ``pattern``."""
    classes = [draw(st.sampled_from(_concrete(m.types))) for m in pattern]
    # Widths stay even when a gated activation (which halves its input) is in the chain.
    gated = any(needs_even_input(c) for c in classes)
    widths = FEATURES.map(lambda w: 2 * w) if gated else FEATURES
    in_features = draw(widths)
    n, specs, chain = in_features, [], {}
    for m, cls in zip(pattern, classes):
        spec = BUILDERS[cls](draw, n, widths, chain)
        assume(m.matches(spec.op))
        specs.append(spec)
        n = spec.out_features
    return in_features, specs
