"""Compose a small transformer-MLP stack, show the fusion plan, train a few steps fused,
unfused and as the same model built from torch.nn on synthetic data, check all three agree,
and report step times against both.

Runs in well under a minute on a CPU; uses CUDA (bf16) when present. On a CPU fuseops runs
its kernels' torch references (the Triton kernels need a GPU): its speed there is not what
it is for.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

import fuseops
from fuseops import ops


def block(hidden: int, ffn: int) -> fuseops.Sequential:
    """Pre-norm MLP block; the residual arrives as an extra input: ``y = block(x, x)``."""
    return fuseops.Sequential(
        ops.RMSNorm(hidden),
        ops.Linear(hidden, ffn),
        ops.GELU(approximate="tanh"),
        ops.Linear(ffn, hidden),
        ops.AddExtraInput(),
    )


def gated_block(hidden: int, ffn: int) -> fuseops.Sequential:
    return fuseops.Sequential(
        ops.LayerNorm(hidden),
        ops.Linear(hidden, 2 * ffn),
        ops.SwiGLU(),
        ops.Linear(ffn, hidden),
        ops.AddExtraInput(),
    )


class Model(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int, depth: int, fuse: bool = True) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            (block if i % 2 == 0 else gated_block)(hidden, ffn) for i in range(depth)
        )
        self.set_fuse(fuse)

    def set_fuse(self, fuse: bool) -> None:
        for b in self.blocks:
            b.fuse = fuse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, x)
        return x


class TorchBlock(torch.nn.Module):
    """A fuseops block written in torch.nn, holding a copy of its parameters."""

    def __init__(self, block: fuseops.Sequential) -> None:
        super().__init__()
        norm, fc1, act, fc2 = block[0], block[1], block[2], block[3]
        self.gated = isinstance(act, ops.SwiGLU)
        if isinstance(norm, ops.RMSNorm):
            self.norm = torch.nn.RMSNorm(norm.weight.shape[0], eps=norm.eps)
        else:
            self.norm = torch.nn.LayerNorm(norm.weight.shape[0], eps=norm.eps)
        self.fc1 = torch.nn.Linear(fc1.in_features, fc1.out_features)
        self.fc2 = torch.nn.Linear(fc2.in_features, fc2.out_features)
        self.load_state_dict({
            **{f"norm.{k}": v for k, v in norm.state_dict().items()},
            **{f"fc1.{k}": v for k, v in fc1.state_dict().items()},
            **{f"fc2.{k}": v for k, v in fc2.state_dict().items()},
        })
        self.to(norm.weight.device, norm.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.fc1(self.norm(x))
        if self.gated:
            gate, up = z.chunk(2, dim=-1)
            h = torch.nn.functional.silu(gate) * up
        else:
            h = torch.nn.functional.gelu(z, approximate="tanh")
        return self.fc2(h) + x


class TorchModel(torch.nn.Module):
    """``Model`` in torch.nn, with the same parameter values."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(TorchBlock(b) for b in model.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def train_side_by_side(models: list[Model], data: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[list[float], float]]:
    """Train each model on the same data, their steps interleaved (so a busy machine slows
    all of them alike); per model its losses and its median steady-state step time."""
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
    losses: list[list[float]] = [[] for _ in models]
    times: list[list[float]] = [[] for _ in models]
    for x, target in data:
        for model, opt, model_losses, model_times in zip(models, opts, losses, times):
            start = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x).float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if x.is_cuda:
                torch.cuda.synchronize()
            model_times.append(time.perf_counter() - start)
            model_losses.append(loss.item())
    # The first step plans and compiles; report the steady state.
    return [(model_losses, statistics.median(model_times[1:] or model_times))
            for model_losses, model_times in zip(losses, times)]


def main() -> None:
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    hidden, ffn, depth, tokens, steps = (1024, 4096, 4, 4096, 10) if cuda else (128, 256, 4, 256, 12)

    fused = Model(hidden, ffn, depth).to(device, dtype)
    unfused = copy.deepcopy(fused)
    unfused.set_fuse(False)
    reference = TorchModel(fused)
    data = [
        (torch.randn(tokens, hidden, device=device, dtype=dtype), torch.randn(tokens, hidden, device=device))
        for _ in range(steps)
    ]

    fused(data[0][0]).float().sum().backward()
    fused.zero_grad(set_to_none=True)
    print(f"device={device} dtype={dtype} hidden={hidden} ffn={ffn} depth={depth} tokens={tokens}")
    for i, b in enumerate(fused.blocks[:2]):
        print(f"block {i} forward plan:  {b.plan.forward}")
        print(f"block {i} backward plan: {b.plan.backward}")

    runs = train_side_by_side([fused, unfused, reference], data)
    (fused_losses, fused_time), (unfused_losses, unfused_time), (torch_losses, torch_time) = runs
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4

    def worst(losses: list[float]) -> float:
        return max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(fused_losses, losses))

    print("step  fused loss   unfused loss  torch.nn loss")
    for i, losses in enumerate(zip(fused_losses, unfused_losses, torch_losses)):
        print(f"{i:4d}  " + "     ".join(f"{loss:.6f}" for loss in losses))
    print(f"largest relative loss difference from fused: unfused {worst(unfused_losses):.2e}, "
          f"torch.nn {worst(torch_losses):.2e} (tolerance {tol:.0e})")
    print(f"median step time (steps interleaved): fused {fused_time * 1e3:.1f} ms, unfused {unfused_time * 1e3:.1f} ms, "
          f"torch.nn {torch_time * 1e3:.1f} ms; fused against unfused {unfused_time / fused_time:.2f}x, "
          f"against torch.nn {torch_time / fused_time:.2f}x")
    if not cuda:
        print("(on a CPU fuseops runs its kernels' torch references: the Triton kernels need a GPU)")
    if worst(unfused_losses) > tol or worst(torch_losses) > tol:
        raise SystemExit("fused, unfused and torch.nn training diverged")
    print("OK: fused, unfused and torch.nn training agree")


if __name__ == "__main__":
    main()
