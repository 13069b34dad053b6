"""Expert parallelism composed with tensor parallelism and FSDP2 in one small model, on gloo
ranks: a block of a sequence-parallel tensor-parallel MLP (FSDP2-sharded over the
data-parallel ranks), an RMSNorm and a router (FSDP2-sharded over every rank) and experts
sharded over every rank (the capacity exchange, in two chunks), trained a few SGD steps,
equals the same block trained in one process in float64 (outputs and every parameter). Its
state dict, gathered by ``fuseops.distributed.gather_state_dict`` at world size 2, loads into
the single-process block and into the block on 4 ranks, giving the same outputs.
``check_composition_trains`` also runs on one GPU over NCCL (tests/distributed/test_nccl.py)."""

import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import fuseops
import fuseops.distributed
from fuseops import ops
from fuseops.moe import combine, dispatch_chunks, permute, unpermute
from tests.distributed.launch import Report, run_on_ranks

HIDDEN, FFN, EXPERT_FFN, EXPERTS, TOP_K = 8, 8, 4, 4, 2
# Token rows per rank; rank r holds rows [r * TOKENS, (r + 1) * TOKENS) of every step's batch.
TOKENS, STEPS, LR = 4, 3, 0.02


class Block(torch.nn.Module):
    """x + MLP(x), then + the top-k experts' mix of its RMS-normed rows. With ``tp_group`` the
    MLP is Megatron's column/row pair with sequence parallelism (each rank its own rows); with
    ``ep_group`` each rank holds EXPERTS / P experts and the rows travel by ``dispatch_chunks``."""

    def __init__(self, dtype, device, *, tp_group=None, ep_group=None):
        super().__init__()
        like = {"device": device, "dtype": dtype}
        column, row = ({}, {}) if tp_group is None else (
            {"tensor_parallel_mode": mode, "tensor_parallel_group": tp_group, "sequence_parallel": True}
            for mode in ("column", "row"))
        self.dense = fuseops.Sequential(
            ops.Linear(HIDDEN, FFN, **column, **like),
            ops.GELU(approximate="tanh"),
            ops.Linear(FFN, HIDDEN, **row, **like),
            ops.AddExtraInput(),
        )
        self.norm = fuseops.Sequential(ops.RMSNorm(HIDDEN, **like))
        self.router = torch.nn.Linear(HIDDEN, EXPERTS, bias=False, **like)
        local = EXPERTS // (1 if ep_group is None else dist.get_world_size(ep_group))
        self.experts = fuseops.Sequential(
            ops.GroupedLinear(local, HIDDEN, 2 * EXPERT_FFN, bias=True, **like),
            ops.SwiGLU(),
            ops.GroupedLinear(local, EXPERT_FFN, HIDDEN, bias=True, **like),
        )
        self.ep_group = ep_group

    def forward(self, x, expert_ids):
        h = self.dense(x, x)
        n = self.norm(h)
        # The routing is given (no top-k of computed scores, whose near-ties rounding could
        # flip); the router's weights still learn through the probabilities.
        probs = torch.softmax(self.router(n), -1).gather(1, expert_ids)
        x_sorted, split_sizes, row_map = permute(n, expert_ids, EXPERTS)
        if self.ep_group is None:
            y_sorted = self.experts(x_sorted, split_sizes, split_sizes)
        else:
            # A rank's T * K rows fit in one destination's slots: nothing is dropped.
            arrived, handle = dispatch_chunks(x_sorted, split_sizes, self.ep_group,
                                              capacity=x.shape[0] * TOP_K, chunks=2)
            y_sorted = combine([self.experts(x_k, s_k, s_k) for x_k, s_k in arrived], handle)
        return h + unpermute(y_sorted, row_map, probs)


def _mesh_shape(world):
    """(data-parallel, tensor-parallel) ranks: TP over pairs of ranks where there are pairs."""
    tp = 2 if world % 2 == 0 else 1
    return world // tp, tp


def _parallel_block(full_state, dtype, device):
    """The block on every rank of the default group, loaded from the full state dict, then
    FSDP2-sharded: the TP MLP over the data-parallel ranks (it sees its TP group's rows, so
    its gradients are summed over the others), the norm and the router over every rank (each
    sees only its own rows). Gradients are summed, not averaged, as the loss is a sum."""
    world = dist.get_world_size()
    dp, tp = _mesh_shape(world)
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    everyone = init_device_mesh(device.type, (world,))
    block = Block(dtype, device, tp_group=mesh["tp"].get_group(), ep_group=dist.group.WORLD)
    local = fuseops.distributed.shard_state_dict(full_state, block, expert_group=dist.group.WORLD)
    block.load_state_dict({k: v.to(device, dtype) for k, v in local.items()})
    for module, on in ((block.dense, mesh["dp"]), (block.norm, everyone), (block.router, everyone)):
        fully_shard(module, mesh=on)
        module.set_gradient_divide_factor(1.0)
    return block


def _data(world, steps):
    """Per step: inputs [world * TOKENS, HIDDEN], expert ids [world * TOKENS, TOP_K] (distinct
    per token) and the output gradient, float64 on CPU."""
    gen = torch.Generator().manual_seed(7)
    rows = world * TOKENS
    return [(torch.randn(rows, HIDDEN, generator=gen, dtype=torch.float64),
             torch.rand(rows, EXPERTS, generator=gen).topk(TOP_K, dim=1).indices,
             torch.randn(rows, HIDDEN, generator=gen, dtype=torch.float64)) for _ in range(steps)]


def _initial_state(dtype):
    """The single-process block's state dict, rounded to ``dtype`` (then float64)."""
    torch.manual_seed(3)
    return {k: v.to(dtype).double() for k, v in Block(torch.float64, "cpu").state_dict().items()}


def _train(block, batches, rows, dtype, device):
    """STEPS of SGD on the sum of <y, dy> over ``rows``; the last step's output (before its update)."""
    opt = torch.optim.SGD(block.parameters(), lr=LR, foreach=False)
    for x, ids, dy in batches:
        opt.zero_grad(set_to_none=True)
        y = block(x[rows].to(device, dtype), ids[rows].to(device))
        y.backward(dy[rows].to(device, dtype))
        opt.step()
    return y.detach()


def check_composition_trains(device, dtypes, report: Report, save_to=None):
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
    for dtype in dtypes:
        full = _initial_state(dtype)
        reference = Block(torch.float64, "cpu")
        reference.load_state_dict(full)
        batches = _data(world, STEPS)
        y64 = _train(reference, batches, slice(None), torch.float64, "cpu")

        block = _parallel_block(full, dtype, device)
        assert isinstance(block.router.weight, DTensor), "FSDP2 did not shard the router"
        assert block.router.weight.to_local().shape[0] == EXPERTS // world
        y = _train(block, batches, rows, dtype, device)
        report.close(y, y64[rows], dtype, "EP+TP+FSDP2 block output, last step", 16)
        trained = fuseops.distributed.gather_state_dict(block, expert_group=dist.group.WORLD)
        want = reference.state_dict()
        assert trained.keys() == want.keys()
        for key, value in trained.items():
            report.close(value, want[key], dtype, f"EP+TP+FSDP2 block {key} after {STEPS} steps", 16)

        # The gathered state dict loads at world size 1: the single-process block gives the
        # sharded block's outputs.
        x, ids, _ = _data(world, 1)[0]
        single = Block(dtype, device)
        single.load_state_dict(trained)
        with torch.no_grad():
            got = block(x[rows].to(device, dtype), ids[rows].to(device))
            want_y = single(x.to(device, dtype), ids.to(device))[rows]
        report.close(got, want_y, dtype, "EP+TP+FSDP2 block output, loaded at world size 1", 4)
        if save_to is not None and rank == 0:
            torch.save({k: v.cpu() for k, v in trained.items()}, save_to)
        dist.barrier()


def check_composition_loads(device, dtypes, report: Report, load_from):
    """The state dict ``check_composition_trains`` saved (at another world size) loads here."""
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
    (dtype,) = dtypes
    full = torch.load(load_from)
    block = _parallel_block(full, dtype, device)
    single = Block(dtype, device)
    single.load_state_dict(full)
    x, ids, _ = _data(world, 1)[0]
    with torch.no_grad():
        got = block(x[rows].to(device, dtype), ids[rows].to(device))
        want = single(x.to(device, dtype), ids.to(device))[rows]
    report.close(got, want, dtype, f"EP+TP+FSDP2 block output, saved at another world size, loaded at {world}", 4)


def _named(check, **kwargs):
    """``check`` with its keyword arguments bound, still named for the failure message."""
    return functools.update_wrapper(functools.partial(check, **kwargs), check)


def test_composition_trains_like_one_process_and_moves_between_world_sizes(tmp_path):
    saved = tmp_path / "block_saved_at_2.pt"
    run_on_ranks(_named(check_composition_trains, save_to=str(saved)), 2, (torch.float64,))
    run_on_ranks(_named(check_composition_loads, load_from=str(saved)), 4, (torch.float64,))


def test_composition_trains_on_a_two_by_two_mesh():
    run_on_ranks(check_composition_trains, 4, (torch.float64,))
