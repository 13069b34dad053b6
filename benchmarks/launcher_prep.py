"""Host microseconds per call of our launchers' own Python, on CPU: each launcher of a dense
block's step (``--part dense``) or of the MoE layer's (``--part moe``: the launchers the sm_90
dispatch picks for bf16 FuseopsMoE of benchmarks/sizes.py, OLMoE shape by default) called on
CPU tensors with ``launch`` replaced by a stub that only keeps its
arguments (issue 20: what a launcher costs besides the launch itself). The launchers run
their GPU configs (no TRITON_INTERPRET), so the TMA path's plan and descriptors are built
as on the GPU (CPU allocations are 16-byte aligned); the launch and Triton's per-descriptor
``CUtensorMap`` are not (``benchmarks.host_costs`` measures them on the GPU).

``--through-launch`` keeps our ``launch`` (its key, the stored-launch lookup and the
descriptors' expansion) and stubs what lies below it: the first call of a key stores a
stand-in compiled kernel whose C launcher does nothing, behind Triton's own descriptor
wrapper (``wrap_handle_tensordesc``), with a stand-in for the ``CUtensorMap`` encoding that
builds the expansion's list but encodes nothing (``fill_tma_descriptor`` is CUDA only).

The MoE rows allocate their outputs as on the GPU, but through the CPU allocator (glibc: a
fresh mapping per call for the largest, ~10 us at 32 MB) rather than the CUDA caching
allocator's free list; ``--part moe`` prints that cost on its own line.

    python -m benchmarks.launcher_prep [--part dense|moe] [--rows 64] [--H 1024] [--calls 4000] [--through-launch]
    python -m benchmarks.launcher_prep --part moe [--tokens 1024] [--experts 64] [--H 2048] [--I 1024] [--top-k 8]
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch

from benchmarks.host_cpu import host_us
from fuseops.kernels.elementwise import activation, bias_grad, gated_activation, norm
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import dense, dense_gated, grouped, grouped_gated, grouped_gated_bwd
from fuseops.kernels.hopper import wgrad
from fuseops.kernels.moe import permute

_LAUNCHING_MODULES = (dense, dense_gated, norm, activation, bias_grad, gated_activation, grouped, grouped_gated,
                      grouped_gated_bwd, wgrad, permute)


@contextlib.contextmanager
def stubbed_launch() -> Iterator[list]:
    """Every launcher's ``launch`` replaced by one that keeps its last arguments."""
    last: list = [None]

    def stub(kernel, grid, *args, **kw):
        last[0] = (kernel, grid, args, kw)

    saved = [m.launch for m in _LAUNCHING_MODULES]
    for m in _LAUNCHING_MODULES:
        m.launch = stub
    try:
        yield last
    finally:
        for m, fn in zip(_LAUNCHING_MODULES, saved):
            m.launch = fn


@contextlib.contextmanager
def stubbed_below_launch() -> Iterator[None]:
    """Our ``launch`` on a pretend CUDA device whose compiled kernels launch nothing."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import driver
    from triton.compiler import make_backend
    from triton.tools.tensor_descriptor import TensorDescriptor

    from fuseops.kernels import launch as fl

    class Launcher:
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, False

        def __init__(self, launch):
            self.launch = launch

    class Compiled:
        function, packed_metadata = 0, (4, 1, 0)

        def __init__(self, launch):
            self.run = Launcher(launch)

    def store(state, key, kernel, grid, device, args, kw):
        params = kernel.params
        signature = {i: ("tensordesc<bf16[16, 16]>" if isinstance(x, TensorDescriptor) else "i32")
                     for i, x in enumerate(args)}
        signature.update({i: "constexpr" for i in range(len(args), len(params))})
        metas = [{"block_size": [16, 16]} for sig in signature.values() if sig.startswith("tensordesc")]
        launch = driver.wrap_handle_tensordesc(lambda *a: None, signature, metas or None)
        tail = tuple(kw.get(p.name, p.default) for p in params[len(args):])
        state.entries[key] = fl._Entry(Compiled(launch), tail, "")

    def encode(arg, meta):
        return [object(), *arg.shape, *arg.strides]

    native_key = fl._native_key
    backend = make_backend(GPUTarget("cuda", 90, 32))

    def native_key_for_sm90(state, *args):  # the backend comes from the (absent) driver
        state.backend = backend
        return native_key(state, *args)

    saved = (fl.ENABLED, fl._current_device, fl._current_stream, fl._store, fl._native_key,
             driver.make_tensordesc_arg)
    fl.ENABLED, fl._current_device, fl._current_stream, fl._store = True, lambda: 0, lambda d: 0, store
    fl._native_key, driver.make_tensordesc_arg = native_key_for_sm90, encode
    try:
        yield
    finally:
        (fl.ENABLED, fl._current_device, fl._current_stream, fl._store, fl._native_key,
         driver.make_tensordesc_arg) = saved
        fl._kernels.clear()




def launchers(M: int, H: int, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """The launches of one dense block's step (RMSNorm, Linear+bias+GELU(tanh), Linear+bias
    with the residual), by the name of the row."""
    F = 4 * H
    x = torch.randn(M, H, dtype=dtype)
    g = torch.ones(H, dtype=dtype)
    w1, b1 = torch.randn(F, H, dtype=dtype), torch.randn(F, dtype=dtype)
    w2, b2 = torch.randn(H, F, dtype=dtype), torch.randn(H, dtype=dtype)
    h, z, dh = torch.randn(M, F, dtype=dtype), torch.randn(M, F, dtype=dtype), torch.randn(M, F, dtype=dtype)
    dy = torch.randn(M, H, dtype=dtype)
    rstd = torch.ones(M, dtype=torch.float32)
    gelu = Activation.GELU_TANH
    return {
        "rmsnorm_fwd": lambda: norm.rmsnorm_fwd(x, g, 1e-6),
        "gemm +bias +gelu +save_preact (fc1 fwd)": lambda: dense.gemm(x, w1.t(), bias=b1, act=gelu, save_preact=True),
        "gemm +bias +residual (fc2 fwd)": lambda: dense.gemm(h, w2.t(), bias=b2, residual=x),
        "bias_grad (fc2 dbias)": lambda: bias_grad.bias_grad(dy),
        "gemm dgrad * gelu'(z) (fc2 dgrad)": lambda: dense.gemm(dy, w2, act=gelu, act_grad_input=z),
        "activation_bwd_dbias": lambda: activation.activation_bwd_dbias(z, dh, gelu),
        "gemm dgrad (fc1 dgrad)": lambda: dense.gemm(dh, w1),
        "rmsnorm_bwd": lambda: norm.rmsnorm_bwd(dy, x, g, rstd),
        # Not in the GELU block's step: the SwiGLU block's fc1 (F = 4H / 2 gate and up columns).
        "gemm_gated +bias +save z (SwiGLU fc1 fwd)": lambda: dense_gated.gemm_gated(
            x, w1.t(), bias=b1, act=Activation.SILU, save_preact=True),
    }


def moe_launchers(T: int, E: int, H: int, I: int, top_k: int, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """The launches of one FuseopsMoE fwd+bwd step (SwiGLU experts, no bias, split sizes on the
    device) as the sm_90 dispatch runs them: permute, FC1 gated forward saving z, FC2 forward,
    FC2 dgrad through the gate rewriting h (dz over z), FC2 and FC1 wgrad on the Gluon kernel,
    FC1 dgrad, unpermute and its backward. Operands uninitialized: the launchers read no data."""
    M = T * top_k
    x, ids = torch.empty(T, H, dtype=dtype), torch.zeros(T, top_k, dtype=torch.int64)
    weights = torch.full((T, top_k), 1.0 / top_k)
    w1, w2 = torch.empty(E, 2 * I, H, dtype=dtype), torch.empty(E, H, I, dtype=dtype)
    x2d, z, h, dy2d = (torch.empty(M, n, dtype=dtype) for n in (H, 2 * I, I, H))
    sizes = torch.full((E,), M // E, dtype=torch.int64)
    offsets = grouped.group_offsets(sizes)
    row_map, dy = torch.empty(T, top_k, dtype=torch.int64), torch.empty(T, H, dtype=dtype)
    silu = Activation.SILU
    return {
        "permute (4 kernels)": lambda: permute.permute(x, ids, E),
        "group_offsets (torch ops)": lambda: grouped.group_offsets(sizes),
        "grouped_gemm_gated +save z (fc1 fwd)": lambda: grouped_gated.grouped_gemm_gated(
            x2d, w1.transpose(1, 2), offsets, act=silu, save_preact=True),
        "grouped_gemm (fc2 fwd)": lambda: grouped.grouped_gemm(h, w2.transpose(1, 2), offsets),
        "unpermute": lambda: permute.unpermute(dy2d, row_map, weights),
        "unpermute_bwd": lambda: permute.unpermute_bwd(dy, row_map, weights, dy2d),
        "dgrad_gated +h, dz over z (fc2 dgrad)": lambda: grouped_gated_bwd.grouped_gemm_dgrad_gated(
            dy2d, w2, offsets, z, act=silu, want_h=True, out=z),
        "gluon wgrad (fc2 wgrad)": lambda: wgrad.grouped_wgrad_hopper(dy2d, h, offsets, out_dtype=dtype),
        "grouped_gemm dgrad (fc1 dgrad)": lambda: grouped.grouped_gemm(z, w1, offsets),
        "gluon wgrad (fc1 wgrad)": lambda: wgrad.grouped_wgrad_hopper(z, x2d, offsets, out_dtype=dtype),
    }


def moe_allocations(T: int, E: int, H: int, I: int, top_k: int, dtype: torch.dtype, calls: int) -> float:
    """CPU allocator's microseconds for the outputs the MoE rows allocate per step (no
    launcher work: what the CUDA caching allocator does faster)."""
    M = T * top_k
    shapes = [(T * top_k, H), (M, I), (M, 2 * I), (M, H), (T, H), (M, H), (M, I), (E, H, I),
              (M, H), (E, 2 * I, H)]
    return host_us(lambda: [torch.empty(s, dtype=dtype) for s in shapes], calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=("dense", "moe"), default="dense")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--H", type=int, default=None, help="1024 dense, 2048 moe")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--I", type=int, default=1024)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--through-launch", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    dtype = torch.bfloat16
    if args.part == "moe":
        H = args.H or 2048
        shape = (args.tokens, args.experts, H, args.I, args.top_k)
        rows = moe_launchers(*shape, dtype)
        title = f"T={args.tokens}, E={args.experts}, H={H}, I={args.I}, top-{args.top_k}"
    else:
        H = args.H or 1024
        rows = launchers(args.rows, H, dtype)
        title = f"rows={args.rows}, H={H}"
    with stubbed_below_launch() if args.through_launch else stubbed_launch():
        results = {name: host_us(fn, args.calls) for name, fn in rows.items()}
    what = "below fuseops launch" if args.through_launch else "launch"
    print(f"launcher prep on CPU, us per call ({title}, bf16, {what} stubbed)")
    for name, us in results.items():
        print(f"{name:42s} {us:7.2f}")
    # The SwiGLU row stands beside the GELU block's step, not in it.
    print(f"{'total per step':42s} {sum(us for name, us in results.items() if 'SwiGLU' not in name):7.2f}")
    if args.part == "moe":
        print(f"{'of which CPU allocation of the outputs':42s} {moe_allocations(*shape, dtype, args.calls):7.2f}")


if __name__ == "__main__":
    main()
