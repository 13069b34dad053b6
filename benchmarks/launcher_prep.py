"""Host microseconds per call of our launchers' own Python, on CPU: each launcher of a dense
block's step called on CPU tensors with ``launch`` replaced by a stub that only keeps its
arguments (issue 20: what a launcher costs besides the launch itself). The launchers run
their GPU configs (no TRITON_INTERPRET), so the TMA path's plan and descriptors are built
as on the GPU (CPU allocations are 16-byte aligned); the launch and Triton's per-descriptor
``CUtensorMap`` are not (``benchmarks.host_costs`` measures them on the GPU).

``--through-launch`` keeps our ``launch`` (its key, the stored-launch lookup and the
descriptors' expansion) and stubs what lies below it: the first call of a key stores a
stand-in compiled kernel whose C launcher does nothing, behind Triton's own descriptor
wrapper (``wrap_handle_tensordesc``), with a stand-in for the ``CUtensorMap`` encoding that
builds the expansion's list but encodes nothing (``fill_tma_descriptor`` is CUDA only).

    python -m benchmarks.launcher_prep [--rows 64] [--H 1024] [--calls 4000] [--through-launch]
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch

from benchmarks.host_cpu import host_us
from fuseops.kernels.elementwise import activation, bias_grad, gated_activation, norm
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import dense

_LAUNCHING_MODULES = (dense, norm, activation, bias_grad, gated_activation)


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
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--H", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--through-launch", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = launchers(args.rows, args.H, torch.bfloat16)
    with stubbed_below_launch() if args.through_launch else stubbed_launch():
        results = {name: host_us(fn, args.calls) for name, fn in rows.items()}
    what = "below fuseops launch" if args.through_launch else "launch"
    print(f"launcher prep on CPU, us per call (rows={args.rows}, H={args.H}, bf16, {what} stubbed)")
    for name, us in results.items():
        print(f"{name:42s} {us:7.2f}")
    print(f"{'total per step':42s} {sum(results.values()):7.2f}")


if __name__ == "__main__":
    main()
