"""Casts for the torch references, which run on CPU and are what ``torch.compile`` traces.

``as_dtype(t, dtype)`` is ``t.to(dtype)`` without the call when ``t`` has that dtype already.
Beside saving the call (~1 us on the host), it keeps a no-op ``to`` out of traced graphs: on
torch 2.11, an ``autograd.Function`` whose forward returns the result of a no-op ``to`` gets a
zero gradient under ``torch.compile`` (Dynamo and AOTAutograd alike: AOT's backward graph takes
zeros in place of the incoming gradient): the expert layer's gradients are 0 with the row sum
ending in ``y.to(y.dtype)`` and right with that ``to`` left out; the dense Sequentials whose last
op's reference ends in one (RMSNorm, GELU, Linear + residual) get x's and every parameter's
gradient 100 % off. torch 2.13 traces both alike.
"""

from __future__ import annotations

import torch


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``: ``t`` itself when it is in ``dtype`` already, else ``t.to(dtype)``."""
    return t if t.dtype == dtype else t.to(dtype)
