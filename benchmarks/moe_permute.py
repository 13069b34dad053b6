"""MoE routing: ``fuseops.moe.permute`` / ``unpermute`` against the same steps in plain
torch (stable argsort + ``index_select`` to group rows, weighted ``index_add_`` to combine),
bf16, on the GPU, in the same run on the same tensors.

Measured: permute forward, unpermute forward, and permute -> unpermute forward+backward
(weights get gradients). GB/s count the bytes an ideal implementation moves (each row read
and written once; ids, maps and weights ignored): permute (T + T*K) * H, unpermute the same,
forward+backward (5*T*K + 4*T) * H, times the element size. ``ratio`` = torch ms / fuseops ms.

    python -m benchmarks.moe_permute            # table; results/moe_permute-<gpu>-<date>.json and .png
    python -m benchmarks.moe_permute --tune     # sweep the row-copy tile
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from pathlib import Path

import torch
import triton
import triton.testing

from benchmarks._results import RESULTS, results_path
from benchmarks.plot import plot_file
from fuseops import moe
from fuseops.kernels.moe import permute as moe_permute

# (name, T, H, E, K): Qwen3-30B-A3B's expert layer and Mixtral-8x7B's.
SHAPES = [("qwen3-30b-a3b", 32768, 2048, 128, 8), ("mixtral-8x7b", 8192, 4096, 8, 2)]
OPS = ("permute", "unpermute", "fwd+bwd")


def torch_permute(x, expert_ids, num_experts):
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sizes = torch.zeros(num_experts, dtype=torch.int64, device=x.device)
    sizes.index_add_(0, flat, torch.ones_like(flat))
    return x.index_select(0, order // expert_ids.shape[1]), sizes, order


def torch_unpermute(y_sorted, order, weights):
    T, K = weights.shape
    w_sorted = weights.reshape(-1)[order].to(y_sorted.dtype)
    y = torch.zeros(T, y_sorted.shape[1], dtype=y_sorted.dtype, device=y_sorted.device)
    return y.index_add_(0, order // K, y_sorted * w_sorted[:, None])


def make_case(T, H, E, K, dtype=torch.bfloat16):
    dev = "cuda"
    return dict(
        x=torch.randn(T, H, device=dev, dtype=dtype),
        # Distinct experts per token, as a router's top-k picks them.
        ids=torch.rand(T, E, device=dev).topk(K, dim=1).indices,
        w=torch.rand(T, K, device=dev).softmax(-1),
        dy=torch.randn(T, H, device=dev, dtype=dtype),
        E=E,
    )


def implementations(case: dict) -> dict[str, dict[str, callable]]:
    x, ids, w, dy, E = case["x"], case["ids"], case["w"], case["dy"], case["E"]
    impls = {}
    for name, permute, unpermute in (
        ("fuseops", moe.permute, moe.unpermute),
        ("torch", torch_permute, torch_unpermute),
    ):
        x_sorted, _, row_map = permute(x, ids, E)
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()

        def fwd_bwd(permute=permute, unpermute=unpermute, xg=xg, wg=wg):
            xs, _, rm = permute(xg, ids, E)
            return torch.autograd.grad(unpermute(xs, rm, wg), (xg, wg), dy)

        impls[name] = {
            "permute": lambda permute=permute: permute(x, ids, E),
            "unpermute": lambda unpermute=unpermute, xs=x_sorted, rm=row_map: unpermute(xs, rm, w),
            "fwd+bwd": fwd_bwd,
        }
    return impls


def check(case: dict) -> float:
    """Same rows, sizes and combine from both; returns the combine's relative difference."""
    x, ids, w, E = case["x"], case["ids"], case["w"], case["E"]
    xs, sizes, row_map = moe.permute(x, ids, E)
    xs_t, sizes_t, order = torch_permute(x, ids, E)
    assert torch.equal(xs, xs_t) and torch.equal(sizes, sizes_t)
    assert torch.equal(row_map.flatten()[order], torch.arange(order.numel(), device=order.device))
    y, y_t = moe.unpermute(xs, row_map, w).float(), torch_unpermute(xs_t, order, w).float()
    return ((y - y_t).norm() / y_t.norm()).item()


def ideal_bytes(op: str, T: int, H: int, K: int, itemsize: int) -> int:
    rows = {"permute": T + T * K, "unpermute": T + T * K, "fwd+bwd": 5 * T * K + 4 * T}[op]
    return rows * H * itemsize


def bench_ms(fn, rep: int) -> float:
    return triton.testing.do_bench(fn, warmup=max(10, rep // 4), rep=rep, return_mode="median")


def run_benchmark(rep: int) -> list[dict]:
    rows = []
    for name, T, H, E, K in SHAPES:
        case = make_case(T, H, E, K)
        err = check(case)
        impls = implementations(case)
        for op in OPS:
            ms = {impl: bench_ms(fns[op], rep) for impl, fns in impls.items()}
            nbytes = ideal_bytes(op, T, H, K, case["x"].element_size())
            rows.append(dict(
                shape=name, T=T, H=H, E=E, K=K, op=op, rel_diff_vs_torch=err,
                **{f"{impl}_ms": v for impl, v in ms.items()},
                **{f"{impl}_gbps": nbytes / (v * 1e-3) / 1e9 for impl, v in ms.items()},
                ratio=ms["torch"] / ms["fuseops"],
            ))
        del case, impls
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    print("\nbf16; GB/s of ideal traffic; ratio = torch ms / fuseops ms")
    head = f"{'shape':<15}{'op':<11}{'fuseops ms':>11}{'GB/s':>7}{'torch ms':>10}{'GB/s':>7}{'ratio':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['shape']:<15}{r['op']:<11}{r['fuseops_ms']:>11.3f}{r['fuseops_gbps']:>7.0f}"
              f"{r['torch_ms']:>10.3f}{r['torch_gbps']:>7.0f}{r['ratio']:>7.2f}")


@contextlib.contextmanager
def config(cfg: moe_permute.PermuteConfig):
    """Run the launchers with ``cfg`` instead of their table (benchmark-only override)."""
    saved = moe_permute._configs
    moe_permute._configs = lambda: cfg
    try:
        yield
    finally:
        moe_permute._configs = saved


def run_tune(rep: int) -> None:
    """Time each row-copy tile on every shape and op; print ms per candidate."""
    base = moe_permute._configs()
    candidates = [
        dataclasses.replace(base, block_t=bt, block_h=bh, num_warps=nw)
        for bt, bh, nw in [(8, 512, 4), (4, 1024, 4), (16, 256, 4), (8, 1024, 8), (16, 512, 8), (2, 2048, 8)]
    ] + [dataclasses.replace(base, block=b) for b in (32, 64)]
    for name, T, H, E, K in SHAPES:
        case = make_case(T, H, E, K)
        for cfg in candidates:
            with config(cfg):
                fns = implementations(case)["fuseops"]
                times = {op: bench_ms(fns[op], rep) for op in OPS}
            print(f"{name:<15}" + "".join(f"{op} {ms:7.3f}  " for op, ms in times.items()) + str(cfg), flush=True)
        del case
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune", action="store_true", help="sweep tiles instead of benchmarking")
    parser.add_argument("--rep", type=int, default=100, help="ms of timed repetitions per measurement")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.tune:
        run_tune(args.rep)
        return
    rows = run_benchmark(args.rep)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    path = results_path("moe_permute", directory=args.out_dir)
    path.write_text(json.dumps(dict(**meta, rows=rows), indent=1))
    plot_file(path)
    print_table(rows)


if __name__ == "__main__":
    main()
