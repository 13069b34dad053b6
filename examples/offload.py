"""Train a stack of fuseops MLP blocks with activation offloading, and check that it
learns exactly as without it.

    python examples/offload.py [--out DIR] [--steps N]

Each block (a fuseops.Sequential call) is an offload group; the last one stays on the
device. Two copies of the model train side by side, with and without offloading, and
their losses must agree bit for bit. Per step it prints the bytes that waited on the
host, and where the step's peak fell as the scheduler accounts it (``stats["peak_where"]``)
with how much more offloading could lower it. On a CPU the scheduling runs with a plain host buffer standing in for pinned
memory (a few seconds). On CUDA (bf16, larger) it also draws the allocated memory over
one step, with and without offloading, into DIR/offload_memory.png; then caps the
process's device memory halfway between the two peaks, where the step without
offloading runs out of memory and training with it still runs.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os

import torch

import fuseops
from fuseops import ops
from fuseops.offload import host_arena, mark_not_offload, offload_activations


def block(hidden: int, ffn: int) -> fuseops.Sequential:
    """Pre-norm MLP block with its residual as an extra input: ``y = block(x, x)``."""
    return fuseops.Sequential(
        ops.RMSNorm(hidden), ops.Linear(hidden, ffn), ops.GELU(approximate="tanh"), ops.Linear(ffn, hidden),
        ops.AddExtraInput(),
    )


class Model(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int, depth: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(block(hidden, ffn) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, x)
        return x


def train_step(model, opt, x, target, offload: bool):
    """One step; with ``offload`` the forward runs inside offload_activations."""
    opt.zero_grad(set_to_none=True)
    if offload:
        with offload_activations(min_tensor_bytes=2**12, group_budget_bytes=None) as handle:
            y = model(x)
    else:
        handle, y = None, model(x)
    loss = (y.float() - target).square().mean()
    loss.backward()
    opt.step()
    return loss.detach(), handle


def train_side_by_side(plain, offloaded, data):
    """Train both copies on the same batches; their losses must agree bit for bit."""
    # Adam moves every weight by about lr per step, so a unit's input sum moves by about
    # lr * fan-in: lr = 0.05 / hidden keeps a step small at any width.
    lr = 0.05 / plain.blocks[0][1].in_features
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (plain, offloaded)]
    for i, (x, target) in enumerate(data):
        loss, _ = train_step(plain, opts[0], x, target, offload=False)
        loss_off, handle = train_step(offloaded, opts[1], x, target, offload=True)
        assert torch.equal(loss, loss_off), f"step {i}: {loss.item()} != {loss_off.item()}"
        s = handle.stats
        print(f"step {i}: loss {loss_off.item():.5f} (bit-for-bit as without offload); "
              f"{s['bytes_offloaded'] / 2**20:.1f} MiB of {s['tensors_offloaded']} saved tensors on the host "
              f"over {s['groups']} groups, {s['bytes_reloaded'] / 2**20:.1f} MiB back; "
              f"{s['tensors_skipped']} stayed; peak {s['peak_bytes'] / 2**20:.1f} MiB at the {s['peak_where']}, "
              f"offloading could lower it by {s['peak_offload_can_lower'] / 2**20:.1f} MiB more")
    arena = host_arena(data[0][0].device)
    print(f"host arena: {arena.reserved_bytes / 2**20:.1f} MiB in {arena.allocations} blocks, "
          f"{arena.lent_bytes} bytes still lent out")
    return opts[1]


def memory_over_step(model, opt, x, target, offload: bool) -> tuple[list[float], float]:
    """memory_allocated (GB) at each block boundary of one training step, forward then
    backward, and the step's peak (GB), the optimizer's temporaries included."""
    samples = []

    def sample(*_):
        samples.append(torch.cuda.memory_allocated() / 1e9)

    def at_block_end(module, args, output):
        sample()
        # Fires when backward reaches this block's output: the start of its backward.
        output.register_hook(sample)

    hooks = [b.register_forward_hook(at_block_end) for b in model.blocks]
    torch.cuda.reset_peak_memory_stats()
    sample()
    train_step(model, opt, x, target, offload)
    sample()
    for h in hooks:
        h.remove()
    return samples, torch.cuda.max_memory_allocated() / 1e9


def plot_memory(curves: dict[str, list[float]], title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for name, curve in curves.items():
        ax.plot(curve, marker=".", label=name)
    ax.set_xlabel("block boundary (forward, then backward)")
    ax.set_ylabel("allocated (GB)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def train_under_a_cap(model, opt, x, target, peaks: dict[str, float], steps: int = 4) -> None:
    """Cap device memory halfway between the two peaks: the step without offloading no
    longer fits, and training with it runs, its loss falling."""
    cap = (peaks["no offload"] + peaks["offload"]) / 2
    total = torch.cuda.get_device_properties(x.device).total_memory / 1e9
    print(f"peaks of one step: {peaks['no offload']:.2f} GB without offload, {peaks['offload']:.2f} GB with; "
          f"capping the process at {cap:.2f} GB (halfway, {cap / total:.4f} of {total:.1f} GB)")
    # The cap limits what the allocator reserves: hand back what it caches first.
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(cap / total, x.device)
    try:
        try:
            train_step(model, opt, x, target, offload=False)
            raise RuntimeError(f"the step without offload fit in {cap:.2f} GB: raise the model size")
        except torch.cuda.OutOfMemoryError:
            print(f"without offload: torch.cuda.OutOfMemoryError, does not fit in {cap:.2f} GB")
        # Nothing of the failed step is kept: its grads go, and the optimizer never stepped.
        opt.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        losses = [train_step(model, opt, x, target, offload=True)[0].item() for _ in range(steps)]
        peak = torch.cuda.max_memory_allocated() / 1e9
        print(f"with offload under the same cap: {steps} steps on one batch, loss "
              + " -> ".join(f"{v:.5f}" for v in losses) + f", peak {peak:.2f} GB")
        assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, x.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    hidden, ffn, depth, tokens = (2048, 8192, 8, 8192) if cuda else (64, 256, 4, 256)

    torch.manual_seed(0)
    plain = Model(hidden, ffn, depth).to(device, dtype)
    offloaded = copy.deepcopy(plain)
    data = [(torch.randn(tokens, hidden, device=device, dtype=dtype),
             torch.randn(tokens, hidden, device=device)) for _ in range(args.steps)]
    for x, _ in data:
        # The inputs stay alive in `data` anyway: moving them would free nothing.
        mark_not_offload(x)
    opt = train_side_by_side(plain, offloaded, data)
    if not cuda:
        return

    # From here on one model: the memory measured is what it needs.
    del plain
    gc.collect()
    torch.cuda.empty_cache()
    x, target = data[0]
    curves, peaks = {}, {}
    for name, on in (("no offload", False), ("offload", True)):
        curves[name], peaks[name] = memory_over_step(offloaded, opt, x, target, on)
    plot_memory(curves, f"{depth} MLP blocks, {tokens} tokens, H={hidden}, bf16",
                os.path.join(args.out, "offload_memory.png"))
    train_under_a_cap(offloaded, opt, x, target, peaks)


if __name__ == "__main__":
    main()
