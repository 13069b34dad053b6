"""What the offload plan counts with, stated rather than timed: the host link's bandwidth
and the device's compute rate per device kind, and each group's compute in FLOPs.

Nothing here reads a clock, so two processes with the same model, shapes, settings and
kind of device plan the same bytes, from the first step. A group's FLOPs come from the
modules called in it (``torch.nn.Linear``, and the ``Linear`` / ``GroupedLinear`` ops of a
``fuseops.Sequential``: two FLOPs per multiply-add of each row); a group where none of
those runs (plain-torch functions, a loss) counts ``FLOPS_PER_SAVED_BYTE`` per byte it
saves. A module holding a ``fuseops.Sequential`` it runs without calling it (a block
passing its experts to ``fuseops.moe.expert_layer``) counts that Sequential once per
row of its own input (each token through one expert: a top-k layer computes k times
that); a Sequential it does call in the step counts once, as itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Pinned host<->device copies, each way, by a substring of the device's name: 53-55 GB/s
# for 64-512 MB copies on H100 and H200 hosts (python -m benchmarks.offload prints its own,
# "measured_rates" in benchmarks/results/offload-<gpu>-<date>.json). Another CUDA device
# counts on a PCIe 4.0 x16 link (25 GB/s); the CPU device's "link" is a host memcpy into a
# separate buffer.
LINK_BYTES_PER_S = {"H100": 54e9, "H200": 54e9, "cuda": 25e9, "cpu": 8e9}
# The compute rate a group's FLOPs run at. H100 / H200: a dense bf16 layer (LayerNorm,
# Linear, GELU, Linear; H=4096, 8192 tokens) runs forward and backward at about 650 TFLOP/s
# (81 ms a step for 8 layers; python -m benchmarks.offload prints the rate,
# "dense_flops_per_s" in its results file).
FLOPS_PER_S = {"H100": 650e12, "H200": 650e12, "cuda": 100e12, "cpu": 5e10}
# The compute of a group whose ops' FLOPs are not known, per byte it saves: a bf16 Linear
# of N outputs computes N FLOPs per byte of its saved input; a transformer MLP layer of
# hidden size H about 0.8 H (3,300 at H=4096). 1024 undercounts most layers: a group
# planned by this rule moves less than its link could hide, never more.
FLOPS_PER_SAVED_BYTE = 1024
# The share of the link a plan counts on (copies also share the device's memory bandwidth).
LINK_MARGIN = 0.9


@dataclass(frozen=True)
class Rates:
    """The link's bytes per second and the compute's FLOPs per second a plan counts on."""

    link_bytes_per_s: float
    flops_per_s: float

    def hidden_bytes(self, flops: int, saved_bytes: int) -> int:
        """Bytes the link moves behind a group's compute (its modules' ``flops``, or the
        saved-bytes rule where none are known), at ``LINK_MARGIN`` of its bandwidth. Not the
        larger of the two: the rule overcounts layers narrower than about 1280 (a dense MLP
        layer of width H computes 0.8 H FLOPs per byte it saves), and an overcount stalls."""
        work = flops if flops > 0 else FLOPS_PER_SAVED_BYTE * saved_bytes
        return int(work / self.flops_per_s * self.link_bytes_per_s * LINK_MARGIN)


def _kind(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    return next((k for k in ("H100", "H200") if k in name), "cuda")


def rates_for(device: torch.device, link_bytes_per_s: float | None = None) -> Rates:
    """The stated rates of ``device``'s kind; ``link_bytes_per_s`` overrides the link's."""
    kind = _kind(device)
    link = LINK_BYTES_PER_S[kind] if link_bytes_per_s is None else float(link_bytes_per_s)
    return Rates(link, FLOPS_PER_S[kind])


@functools.cache
def _fuseops_classes() -> tuple[type, tuple[type, ...]]:
    # offload/ is the top layer: the ops and Sequential are imported on first use, so
    # that fuseops/__init__ can import this package in any order.
    from fuseops.ops import GroupedLinear, Linear
    from fuseops.sequential import Sequential

    return Sequential, (Linear, GroupedLinear)


def runs_its_children(module: torch.nn.Module) -> bool:
    """Whether ``module`` runs its children without calling them (a ``fuseops.Sequential``
    executes its ops directly, so no module hook sees them)."""
    return isinstance(module, _fuseops_classes()[0])


def held_sequentials(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The ``fuseops.Sequential`` children of ``module`` (not itself one)."""
    sequential = _fuseops_classes()[0]
    if isinstance(module, sequential):
        return []
    return [child for child in module.children() if isinstance(child, sequential)]


def module_flops(module: torch.nn.Module, args: tuple) -> int:
    """Forward FLOPs of one call of ``module`` with ``args`` where they are known, else 0:
    a ``torch.nn.Linear``, or a ``fuseops.Sequential``'s ``Linear`` and ``GroupedLinear``
    ops (each row goes through one group's weight)."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None or x.dim() == 0 or x.shape[-1] == 0:
        return 0
    rows = x.numel() // x.shape[-1]
    if type(module) is torch.nn.Linear:
        return 2 * rows * module.in_features * module.out_features
    sequential, linears = _fuseops_classes()
    if isinstance(module, sequential):
        return sum(2 * rows * op.in_features * op.out_features for op in module.children() if isinstance(op, linears))
    return 0
