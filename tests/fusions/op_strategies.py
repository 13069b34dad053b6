"""Hypothesis strategies that build any basic op, so that a fusion's pattern can be
instantiated from its declaration alone (no per-fusion test code).

``BUILDERS`` maps each concrete op class to ``build(draw, in_features, widths) -> OpSpec``
(``widths`` draws the output width of ops that choose one); a
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

# Feature sizes: 1, tile non-multiples and a tile multiple; small for the interpreter.
FEATURES = st.sampled_from([1, 2, 3, 8, 17, 32, 40])


@dataclass
class OpSpec:
    op: ops.BasicOp
    out_features: int
    # Each makes one extra input from (leading shape, in_features, dtype, device).
    extra_inputs: list[Callable[[tuple[int, ...], int, torch.dtype, str], Any]] = field(default_factory=list)


def _residual(lead, features, dtype, device):
    return torch.randn(*lead, features, dtype=dtype, device=device)


def _probs(lead, features, dtype, device):
    return torch.rand(math.prod(lead), dtype=torch.float32, device=device)


def _linear(draw, n, widths):
    out = draw(widths)
    return OpSpec(ops.Linear(n, out, bias=draw(st.booleans())), out)


def _gated(cls):
    def build(draw, n, widths):
        scaled = draw(st.booleans())
        op = cls(interleaved=draw(st.booleans()), scaled=scaled)
        return OpSpec(op, n // 2, [_probs] if scaled else [])

    return build


def _plain(cls, **kwargs):
    return lambda draw, n, widths: OpSpec(cls(**kwargs), n)


BUILDERS: dict[type, Callable] = {
    ops.Linear: _linear,
    ops.Bias: lambda draw, n, widths: OpSpec(ops.Bias(n), n),
    ops.ReLU: _plain(ops.ReLU),
    ops.GELU: lambda draw, n, widths: OpSpec(ops.GELU(approximate=draw(st.sampled_from(["none", "tanh"]))), n),
    ops.SiLU: _plain(ops.SiLU),
    ops.SReLU: _plain(ops.SReLU),
    ops.Sigmoid: _plain(ops.Sigmoid),
    ops.SwiGLU: _gated(ops.SwiGLU),
    ops.GeGLU: _gated(ops.GeGLU),
    ops.ReGLU: _gated(ops.ReGLU),
    ops.SReGLU: _gated(ops.SReGLU),
    ops.ClampedSwiGLU: _gated(ops.ClampedSwiGLU),
    ops.LayerNorm: lambda draw, n, widths: OpSpec(ops.LayerNorm(n, zero_centered_gamma=draw(st.booleans())), n),
    ops.RMSNorm: lambda draw, n, widths: OpSpec(ops.RMSNorm(n, zero_centered_gamma=draw(st.booleans())), n),
    ops.AddExtraInput: lambda draw, n, widths: OpSpec(ops.AddExtraInput(), n, [_residual]),
    ops.MakeExtraOutput: _plain(ops.MakeExtraOutput),
    ops.Identity: _plain(ops.Identity),
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
    n, specs = in_features, []
    for m, cls in zip(pattern, classes):
        spec = BUILDERS[cls](draw, n, widths)
        assume(m.matches(spec.op))
        specs.append(spec)
        n = spec.out_features
    return in_features, specs
