"""Session 55 probe (issue 20, compiled >= torch.compile at host-bound cells): what dynamo's guard evaluation costs a
compiled step's host. A compiled fuseops stack installs ~3x the guards of the same torch.nn model (CPU, 4 blocks of
GELU: 1,088 against 354, `TORCH_LOGS=guards`; skipping their evaluation saved ~70 us a step of the fuseops model
and ~10-30 of torch.compile's on this project's CPU machine). Here, on the device, paired step by step as session 53's
host_ab.py: each iteration drains the device, queues a GPU spin so that no step waits on the GPU, then times the
host of one step with guards evaluated and one with them skipped (`torch.compiler.set_stance(skip_guard_eval_unsafe=
True)`: safe here, nothing a guard checks changes between steps), the order alternating. Also the host of a compiled
one-parameter module (torch.compile's fixed cost per fwd+bwd region).

    python benchmarks/results/session55/compiled_guards.py [--cells swiglu:1024:2048 gelu:1024:2048] [--pairs 100]
"""
import argparse
import statistics
import time

import torch

from benchmarks.sizes import dense_cell, step_fn


def paired(step, pairs: int, device: str) -> tuple[float, float, float]:
    """Median host ms with guards, without, and the median paired ratio with / without."""
    on, off, ratios = [], [], []
    for i in range(pairs):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda._sleep(30_000_000)
        got = {}
        for guards in ((True, False) if i % 2 == 0 else (False, True)):
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=not guards):
                start = time.perf_counter()
                step()
                got[guards] = (time.perf_counter() - start) * 1e3
        on.append(got[True])
        off.append(got[False])
        ratios.append(got[True] / got[False])
    if device == "cuda":
        torch.cuda.synchronize()
    return statistics.median(on), statistics.median(off), statistics.median(ratios)


class _Tiny(torch.nn.Module):
    def __init__(self, device: str) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["swiglu:1024:2048", "gelu:1024:2048", "swiglu:1024:1024"])
    p.add_argument("--pairs", type=int, default=100)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    tiny = _Tiny(a.device)
    x = torch.randn(16, 4, device=a.device, requires_grad=True)
    cells = {"tiny module": (tiny, x)}
    for cell in a.cells:
        model, ref, x = dense_cell(cell, a.device, dtype)
        cells[f"{cell} fuseops"] = (model, x)
        cells[f"{cell} torch.nn"] = (ref, x)
    for name, (model, x) in cells.items():
        step = step_fn(torch.compile(model), (x,), list(model.parameters()))
        for _ in range(40):
            step()
        on, off, ratio = paired(step, a.pairs, a.device)
        print(f"{name:26} compiled host ms: guards {on:6.3f}  skipped {off:6.3f}  (paired median ratio {ratio:5.3f}, "
              f"guards ~{on - off:+.3f} ms)", flush=True)


if __name__ == "__main__":
    main()
