"""Activations declared as a user declares one (``ops.declare_activation``), for the tests of
declared activations and for the fusion property suite's op strategies."""

import torch
import triton
import triton.language as tl

from fuseops import ops


@triton.jit
def xrelu(x):
    # Squared ReLU with a leak: x^2 for x > 0, 0.5 x below (not a shipped activation).
    pos = x > 0.0
    return tl.where(pos, x * x, 0.5 * x), tl.where(pos, 2.0 * x, 0.5)


def xrelu_reference(x):
    return torch.where(x > 0, x * x, 0.5 * x)


def xrelu_grad(x):
    return torch.where(x > 0, 2 * x, 0.5)


# One takes its torch derivative from the reference, the other is given it.
XReLU = ops.declare_activation("XReLU", kernel=xrelu, reference=xrelu_reference)
XReGLU = ops.declare_activation("XReGLU", kernel=xrelu, reference=xrelu_reference, reference_grad=xrelu_grad,
                                gated=True, limit=3.0)
