"""Tensor parallelism over ``torch.distributed``: process-group checks, collectives along
the first dim, and the Megatron column/row-parallel plumbing that ``Linear`` calls.

P is the size of the tensor-parallel group. Megatron-LM's scheme (Shoeybi et al. 2019;
sequence parallelism (SP) from Korthikanti et al. 2022), around the local GEMM:

    mode    weight         forward                                  backward (dx)
    column  [out/P, in]    x (all-gather dim 0 with SP) -> x W^T + b   dx all-reduce (reduce-scatter with SP)
    row     [out, in/P]    x W^T -> all-reduce (reduce-scatter) -> + b   dy (all-gather with SP) -> dy W

The column bias is sharded like the weight; the row bias is whole and added after the
reduction, once. With SP the first dim of the activations outside the pair is split
over the ranks (sequence-major layouts such as [s, b, h], or token rows). Without SP,
what follows a row-parallel Linear runs alike on every rank, so its ``dy`` (and its
bias gradient) is the same everywhere; with SP the row bias gradient comes from the
gathered ``dy`` and is whole too. Weight gradients are this rank's shard.

Under a quantized recipe the collectives stay in the activation's dtype: the local GEMM
quantizes its own (gathered) input, and backward quantizes the (gathered) ``dy``, as the
unparallel Linear does. Per-tensor scales (FP8 current scaling, NVFP4) are then each
rank's own operand's; no amax is reduced over the ranks, as none needs to be: every
quantized operand is a tensor of its own GEMM. Column parallel with SP keeps the
column-wise quantized copy of its gathered input for the weight gradient (no re-gather).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fuseops.ops import _checks
from fuseops.ops.contract import OpContext, TensorSpec

# ``F.linear``'s signature: the local GEMM that the collectives surround.
Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def _all_gather_single(*args: Any, **kwargs: Any) -> Any:
    # torch 2.13 renamed the single-tensor collectives; the GPU image runs an older torch.
    # Looked up per call: builds without torch.distributed still import fuseops.
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(*args, **kwargs)


def _reduce_scatter_single(*args: Any, **kwargs: Any) -> Any:
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(*args, **kwargs)


class ParallelMode(str, enum.Enum):
    """How a Linear's weight is split over the tensor-parallel group."""

    COLUMN = "column"
    ROW = "row"


def check_group(name: str, group: Any) -> dist.ProcessGroup:
    """``group`` must be a process group this rank belongs to."""
    from torch.distributed.distributed_c10d import GroupMember

    if isinstance(group, int) and group == GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"{name}: this rank is not a member of the given process group; expected a group "
            "that contains this rank (dist.new_group returns a placeholder on other ranks)"
        )
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"{name}: expected a torch.distributed ProcessGroup (e.g. dist.group.WORLD after "
            f"dist.init_process_group, or dist.new_group(ranks)), got {type(group).__name__}"
        )
    return group


def first_dim(op: str, spec: TensorSpec) -> int:
    """The first dim of an input that collectives split or concatenate."""
    if len(spec.shape) == 0:
        raise ValueError(f"{op} input: expected at least one dim to gather or scatter along, got a 0-d tensor")
    return spec.shape[0]


def divisible_first_dim(op: str, spec: TensorSpec, world_size: int) -> int:
    """The first dim, which must split evenly over the group's ranks."""
    n = first_dim(op, spec)
    if n % world_size != 0:
        raise ValueError(
            f"{op} input: expected the first dim divisible by the group size {world_size}, "
            f"got shape {_checks.shown(spec.shape)}"
        )
    return n


@dataclass(frozen=True)
class Pending:
    """A collective started with ``async_op``: ``wait()`` before reading ``tensor``."""

    tensor: torch.Tensor
    work: Any = None

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
        return self.tensor


def start_all_gather(x: torch.Tensor, group: dist.ProcessGroup) -> Pending:
    """Concatenation of every rank's ``x`` along dim 0, started asynchronously."""
    world = dist.get_world_size(group)
    out = x.new_empty((world * x.shape[0], *x.shape[1:]))
    return Pending(out, _all_gather_single(out, x.contiguous(), group=group, async_op=True))


def start_reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup) -> Pending:
    """This rank's 1/P chunk (dim 0) of the sum of every rank's ``x``, started asynchronously."""
    world = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] // world, *x.shape[1:]))
    return Pending(out, _reduce_scatter_single(out, x.contiguous(), group=group, async_op=True))


def all_gather(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return start_all_gather(x, group).wait()


def reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return start_reduce_scatter(x, group).wait()


def all_reduce_(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum of every rank's ``x``, in place: ``x`` must be a fresh contiguous tensor."""
    dist.all_reduce(x, group=group)
    return x


@dataclass(frozen=True)
class TensorParallel:
    """A Linear's tensor-parallel configuration (``Linear.tensor_parallel``)."""

    mode: ParallelMode
    group: dist.ProcessGroup
    sequence_parallel: bool
    world_size: int
    rank: int

    @classmethod
    def build(
        cls, mode: Any, group: Any, sequence_parallel: bool, in_features: int, out_features: int
    ) -> TensorParallel | None:
        """Validate the public arguments once; ``None`` when the Linear is not sharded."""
        if mode is None:
            if group is not None or sequence_parallel:
                given = "tensor_parallel_group" if group is not None else "sequence_parallel=True"
                raise ValueError(
                    f"{given}: expected tensor_parallel_mode 'column' or 'row' with it, got None"
                )
            return None
        valid = [m.value for m in ParallelMode]
        if mode not in valid:
            raise ValueError(
                f"tensor_parallel_mode: expected None or one of {', '.join(map(repr, valid))}, got {mode!r}"
            )
        mode = ParallelMode(mode)
        if group is None:
            raise ValueError(
                f"tensor_parallel_group: expected a torch.distributed ProcessGroup with "
                f"tensor_parallel_mode={mode.value!r}, got None"
            )
        check_group("tensor_parallel_group", group)
        world = dist.get_world_size(group)
        name, size = ("out_features", out_features) if mode is ParallelMode.COLUMN else ("in_features", in_features)
        if size % world != 0:
            raise ValueError(
                f"{name}: expected a multiple of the tensor-parallel group size {world} "
                f"for tensor_parallel_mode={mode.value!r}, got {size}"
            )
        return cls(mode, group, bool(sequence_parallel), world, dist.get_rank(group))

    @property
    def column(self) -> bool:
        return self.mode is ParallelMode.COLUMN

    def local_shape(self, in_features: int, out_features: int) -> tuple[int, int]:
        """The weight shard's ``(out, in)``."""
        if self.column:
            return out_features // self.world_size, in_features
        return out_features, in_features // self.world_size

    def output_spec(self, x: TensorSpec, in_features: int, out_features: int) -> TensorSpec:
        """Check the local input of a sharded Linear and give its local output spec."""
        local_out, local_in = self.local_shape(in_features, out_features)
        if len(x.shape) == 0 or x.shape[-1] != local_in:
            split = "" if self.column else f" ({in_features} in_features split over {self.world_size} ranks)"
            raise ValueError(f"Linear input: expected shape [..., {local_in}]{split}, got {_checks.shown(x.shape)}")
        shape = x.shape[:-1] + (local_out,)
        if self.sequence_parallel:
            if len(x.shape) < 2:
                raise ValueError(
                    f"Linear input: expected a sequence (first) dim before the features with "
                    f"sequence_parallel=True, got shape {_checks.shown(x.shape)}"
                )
            if self.column:
                shape = (x.shape[0] * self.world_size,) + shape[1:]
            else:
                divisible_first_dim("Linear (row parallel, sequence parallel)", x, self.world_size)
                shape = (x.shape[0] // self.world_size,) + shape[1:]
        return x.with_shape(shape)

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, gemm: Gemm = F.linear
    ) -> torch.Tensor:
        """The collectives around the local ``gemm`` (``F.linear``, or the quantized one
        under a recipe, which then sees the gathered input and returns the partial sum)."""
        if self.column:
            if self.sequence_parallel:
                x = all_gather(x, self.group)
            return gemm(x, weight, bias)
        y = gemm(x, weight, None)
        y = reduce_scatter(y, self.group) if self.sequence_parallel else all_reduce_(y, self.group)
        # Added after the reduction, so every rank adds the whole bias exactly once.
        return y if bias is None else y.add_(bias)

    def backward(
        self, linear: torch.nn.Module, ctx: OpContext, dy: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor | None]]:
        """``(dx, param grads)`` of a sharded Linear: the collectives around its local
        ``input_grad`` / ``param_grads``, each overlapped with the other GEMM."""
        if not self.column and self.sequence_parallel:
            # The backward of the forward's reduce-scatter; both GEMMs read the whole dy.
            dy = all_gather(dy, self.group)
        # Under a recipe dy is quantized after its gather, once for both GEMMs.
        qdy = linear.quantize_grad(ctx, dy)
        # Column parallel with SP keeps only its input shard for backward and re-gathers
        # it for the weight gradient (saving P-1 shards), overlapping the dgrad GEMM.
        # Quantized, it kept the column-wise copy of the gathered input instead.
        gather = None
        if self.column and self.sequence_parallel and ctx.weight_requires_grad and qdy is None:
            gather = start_all_gather(ctx.saved.x, self.group)
        dx = linear.input_grad(ctx, dy, qdy)
        reduction = None
        if self.column and dx is not None:
            # Each rank holds a partial dx (its slice of the out features); the sum
            # overlaps the weight-gradient GEMM.
            dx = dx.contiguous()
            if self.sequence_parallel:
                reduction = start_reduce_scatter(dx, self.group)
            else:
                reduction = Pending(dx, dist.all_reduce(dx, group=self.group, async_op=True))
        if gather is not None:
            ctx.saved = dataclasses.replace(ctx.saved, x=gather.wait())
        params = linear.param_grads(ctx, dy, qdy=qdy)
        return (dx if reduction is None else reduction.wait()), params
