"""Compile a launcher's Triton kernel for sm_90a on a machine without a GPU and report what
ptxas made of it: registers, spills, shared memory, and SASS opcode counts.

The launcher runs on CPU tensors of the real shapes; its ``kernel[grid](...)`` call is caught
and compiled with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``
instead of launched. The bundled ``ptxas -v`` and ``nvdisasm`` give the report.

    python -m benchmarks.sm90_report gated_dgrad [--sass out.sass] [--set want_h=False ...]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import re
import subprocess
import tempfile
from pathlib import Path
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


@contextlib.contextmanager
def caught(module, name: str, sink: list):
    """Replace ``module.name`` (a JITFunction) by a stand-in that records each launch."""
    kernel = getattr(module, name)

    class StandIn:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: sink.append((kernel, grid, args, kwargs))

    setattr(module, name, StandIn())
    try:
        yield
    finally:
        setattr(module, name, kernel)


def compile_sm90(kernel, args, kwargs):
    """The compiled kernel (sm_90a) for one caught launch."""
    names = kernel.arg_names
    options = {k: kwargs[k] for k in ("num_warps", "num_stages", "maxnreg") if k in kwargs}
    # Gluon kernels take num_warps as a constexpr argument too.
    kwargs = {k: v for k, v in kwargs.items() if k not in options or k in names}
    values = dict(zip(names, args), **kwargs)
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        param = kernel.params[i]
        value = values[name]
        if param.is_constexpr:
            signature[name] = "constexpr"
            constexprs[name] = value
            continue
        if isinstance(value, int) and value == 1:
            signature[name] = "constexpr"
            constexprs[name] = 1
            continue
        signature[name] = mangle_type(value)
        aligned = (isinstance(value, torch.Tensor) and value.data_ptr() % 16 == 0) or (
            isinstance(value, int) and value % 16 == 0)
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = GluonASTSource if getattr(kernel, "is_gluon", lambda: False)() else ASTSource
    src = source(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def report(compiled, sass_path: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        cubin = Path(tmp) / "k.cubin"
        res = subprocess.run([_BIN / "ptxas", "-v", "-arch=sm_90a", ptx, "-o", cubin],
                             capture_output=True, text=True)
        sass = subprocess.run([_BIN / "nvdisasm", "-c", cubin], capture_output=True, text=True).stdout
    if sass_path:
        sass_path.write_text(sass)
    info = res.stderr
    # "/*0840*/  @!P3 MUFU.RCP R6, R6 ;" -> MUFU
    opcode = re.compile(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)")
    ops = collections.Counter(m.group(1) for m in opcode.finditer(sass))
    # ptxas -v has a line of spills per function: the kernel's, and each called one's (a
    # noinline @triton.jit function, CUDA's division slow path) in the registers the kernel has.
    spills = re.findall(r"Function properties for (\S+)\n\s+\d+ bytes stack frame, (\d+) bytes spill stores, "
                        r"(\d+) bytes spill loads", info)
    # SASS lines by function: each starts at its ".type NAME,@function".
    parts = re.split(r"^\s+\.type\s+(\S+),@function$", sass, flags=re.MULTILINE)
    lines = {name: len(opcode.findall(body)) for name, body in zip(parts[1::2], parts[2::2])}
    functions = {_short(name): {"spill_stores": int(st), "spill_loads": int(ld),
                                "sass_lines": next((n for k, n in lines.items() if k.endswith(name)), None)}
                 for name, st, ld in spills}
    return dict(
        registers=int(re.search(r"Used (\d+) registers", info).group(1)),
        spill_stores=sum(f["spill_stores"] for f in functions.values()),
        spill_loads=sum(f["spill_loads"] for f in functions.values()),
        shared=compiled.metadata.shared,
        sass_lines=sum(ops.values()),
        top_ops=ops.most_common(25),
        functions=functions,
    )


def _short(name: str) -> str:
    """A function's name without Triton's module path and specialization suffix."""
    return re.sub(r"__P.*$", "", name).split("_$_")[-1]


def gated_dgrad_launch(sink, *, want_h=True, cfg=None):
    """FC2's gated dgrad at the Mixtral shape (bf16 SwiGLU with probs)."""
    from fuseops.kernels.elementwise.activation_math import Activation
    from fuseops.kernels.gemm import grouped_gated_bwd as mod

    E, M, H, I = 8, 16384, 4096, 14336
    bf = dict(dtype=torch.bfloat16)
    dy, z, w2 = torch.empty(M, H, **bf), torch.empty(M, 2 * I, **bf), torch.empty(E, H, I, **bf)
    offsets = torch.arange(0, M + 1, M // E, dtype=torch.int64)
    probs = torch.empty(M, **bf)
    with caught(mod, "grouped_gemm_gated_bwd_kernel", sink), contextlib.suppress(RuntimeError):
        # The launcher goes on to launch dprobs' column sum, which needs a driver: not caught.
        mod.launch_grouped_gemm_dgrad_gated(dy, w2, offsets, z, Activation.SILU, False, False, 7.0,
                                            1.0, probs, want_h, None, cfg)


def gated_fwd_launch(sink, *, cfg=None):
    """FC1's gated forward at the Mixtral shape (bf16 SwiGLU with probs, z saved)."""
    from fuseops.kernels.elementwise.activation_math import Activation
    from fuseops.kernels.gemm import grouped_gated as mod

    E, M, H, I = 8, 16384, 4096, 14336
    bf = dict(dtype=torch.bfloat16)
    x, w1, probs = torch.empty(M, H, **bf), torch.empty(E, 2 * I, H, **bf), torch.empty(M, **bf)
    offsets = torch.arange(0, M + 1, M // E, dtype=torch.int64)
    with caught(mod, "grouped_gemm_gated_fwd_kernel", sink):
        mod.launch_grouped_gemm_gated(x, w1.transpose(1, 2), offsets, None, Activation.SILU, False,
                                      False, 7.0, 1.0, probs, True, None, cfg)


def _fp8_rows(rows: int, K: int):
    from fuseops.kernels.quantization.operand import Operand

    return Operand(torch.empty(rows, K, dtype=torch.float8_e4m3fn), torch.empty(rows, K // 128))


def blockwise_fwd_launch(sink, *, out_dtype=torch.bfloat16):
    """The FP8 blockwise grouped forward (Gluon) at the Mixtral FC1 shape, 128x128 weight blocks."""
    from fuseops.kernels.hopper import blockwise as mod
    from fuseops.kernels.quantization.operand import Operand

    E, M, K, N = 8, 16384, 4096, 28672
    w = Operand(torch.empty(E, N, K, dtype=torch.float8_e4m3fn), torch.empty(E, N // 128, K // 128),
                rows_per_scale=128)
    offsets = torch.arange(0, M + 1, M // E, dtype=torch.int64)
    with caught(mod, "grouped_fp8_kernel", sink):
        mod.grouped_blockwise(_fp8_rows(M, K), w, offsets, torch.empty(M, N, dtype=out_dtype), None)


def blockwise_wgrad_launch(sink, *, accumulate=False, along_n=None):
    """The FP8 blockwise grouped wgrad (Gluon) at the Mixtral FC1 shape (``along_n``: the
    walk order, else the shape's)."""
    from fuseops.kernels.hopper import blockwise_wgrad as mod

    E, P, N, K = 8, 16384 + 8 * 128, 28672, 4096
    offsets = torch.arange(0, 16384 + 1, 16384 // E, dtype=torch.int64)
    dw = torch.empty(E, N, K, dtype=torch.float32 if accumulate else torch.bfloat16)
    with caught(mod, "grouped_fp8_wgrad_kernel", sink):
        mod.grouped_blockwise_wgrad(_fp8_rows(N, P), _fp8_rows(K, P), offsets, dw, accumulate, along_n)


def _tensor_rows(rows: int, K: int):
    from fuseops.kernels.quantization.operand import Operand

    return Operand(torch.empty(rows, K, dtype=torch.float8_e4m3fn), None, outer=torch.ones(1))


def tensor_scaled_fwd_launch(sink, *, out_dtype=torch.bfloat16, bias=False):
    """The FP8 per-tensor grouped forward (Gluon, the ping-pong kernel) at the Qwen3-30B-A3B FC1
    shape (E=128, 262144 rows, 2048 -> 1536), one scale per group."""
    from fuseops.kernels.hopper import tensor_scaled
    from fuseops.kernels.quantization.operand import Operand

    E, M, K, N = 128, 262144, 2048, 1536
    w = Operand(torch.empty(E, N, K, dtype=torch.float8_e4m3fn), None, outer=torch.ones(E))
    offsets = torch.arange(0, M + 1, M // E, dtype=torch.int64)
    y, b = torch.empty(M, N, dtype=out_dtype), torch.empty(E, N, dtype=out_dtype) if bias else None
    with caught(tensor_scaled, "grouped_tensor_scaled_kernel", sink):
        tensor_scaled.grouped_tensor_scaled(_tensor_rows(M, K), w, offsets, y, b)


def tensor_scaled_wgrad_launch(sink, *, accumulate=False):
    """The FP8 per-tensor grouped wgrad (Gluon) at the Qwen3-30B-A3B FC1 shape, written in bf16
    or added to a float32 main_grad."""
    from fuseops.kernels.hopper import tensor_scaled_wgrad as mod

    E, P, N, K = 128, 262144 + 128 * 128, 1536, 2048
    offsets = torch.arange(0, 262144 + 1, 262144 // E, dtype=torch.int64)
    dw = torch.empty(E, N, K, dtype=torch.float32 if accumulate else torch.bfloat16)
    a, b = (dataclasses.replace(_tensor_rows(rows, P), outer=torch.ones(E)) for rows in (N, K))
    with caught(mod, "grouped_fp8_wgrad_kernel", sink):
        mod.grouped_tensor_scaled_wgrad(a, b, offsets, dw, accumulate)


def _wgrad_operands():
    E, M, N, K = 8, 16384, 28672, 4096
    dz, x = torch.empty(M, N, dtype=torch.bfloat16), torch.empty(M, K, dtype=torch.bfloat16)
    return dz, x, torch.arange(0, M + 1, M // E, dtype=torch.int64), (E, N, K)


def bf16_wgrad_launch(sink, *, accumulate=False, along_n=None, out_dtype=None):
    """The bf16 grouped wgrad (Gluon) at the Mixtral FC1 shape, written (in ``out_dtype``: the
    operands' or float32) or into main_grad (``along_n``: the walk order, else the shape's)."""
    from fuseops.kernels.hopper import wgrad as mod

    dz, x, offsets, shape = _wgrad_operands()
    main_grad = torch.empty(shape) if accumulate else None
    with caught(mod, "grouped_wgrad_kernel", sink):
        mod.grouped_wgrad_hopper(dz, x, offsets, main_grad, along_n=along_n, out_dtype=out_dtype)


def triton_wgrad_launch(sink, *, accumulate=False, out_dtype=None):
    """The Triton grouped wgrad for bf16 operands at the Mixtral FC1 shape (where the Gluon
    kernel does not serve), written (in ``out_dtype``) or into main_grad."""
    from fuseops.kernels.gemm import grouped_wgrad as mod

    dz, x, offsets, shape = _wgrad_operands()
    main_grad = torch.empty(shape) if accumulate else None
    with caught(mod, "grouped_gemm_wgrad_kernel", sink):
        mod.grouped_gemm_wgrad(dz, x, offsets, main_grad=main_grad, out_dtype=out_dtype)


def quantize_launch(sink, *, scaling="BLOCK", columnwise=True, rowwise=True, cfg=None, grouped=False, maxnreg=None,
                    dtype="bfloat16", groups=8, gather=False, element="E4M3"):
    """The quantize kernel on [16384, 4096] (``benchmarks.quantize``'s shape) of ``dtype`` (a
    torch dtype's name) in ``scaling`` (a ``Scaling`` name) with ``element``'s codes (an ``Element``
    name; NVFP4 always E2M1), in the tiling
    the library picks or ``cfg`` (a ``QuantizeConfig``); ``grouped``: ``groups`` equal row groups;
    ``gather``: the rows picked from a [2048, 4096] x (``rows=``, the quantized expert layer's)."""
    from fuseops.kernels.quantization import quantize as mod
    from fuseops.kernels.quantization.formats import Element, Scaling

    scaling = Scaling[scaling]
    x = torch.empty(1, 2048 if gather else 16384, 4096, dtype=getattr(torch, dtype))
    rows = torch.arange(16384, dtype=torch.int64) % 2048 if gather else None
    offsets = torch.arange(0, 16384 + 1, 16384 // groups, dtype=torch.int64) if grouped else None
    encode = torch.ones(groups if grouped else 1) if scaling in (Scaling.TENSOR, Scaling.NVFP4) else None
    element = Element.E2M1 if scaling == Scaling.NVFP4 else Element[element]
    cfg = cfg or mod.pick_config(scaling, False, columnwise, grouped=grouped, gathered=gather)
    with caught(mod, "quantize_kernel", sink):
        mod.launch_quantize(x, offsets, encode, scaling, element, False, rowwise, columnwise, None, cfg, rows=rows)
    if maxnreg:
        sink[-1][3]["maxnreg"] = maxnreg


def amax_launch(sink, *, gather=False, groups=128, kernel="amax"):
    """The amax kernel over 262144 grouped rows of 2048 bf16 (Qwen3-30B-A3B's x_sorted), read in
    place or picked from [32768, 2048] tokens (``gather``); or ``kernel="row_amax"`` over the tokens."""
    from fuseops.kernels.quantization import amax as mod

    tokens = torch.empty(32768, 2048, dtype=torch.bfloat16)
    if kernel == "row_amax":
        with caught(mod, "row_amax_kernel", sink):
            mod.row_amax(tokens)
        return
    x = tokens[None] if gather else torch.empty(1, 262144, 2048, dtype=torch.bfloat16)
    rows = torch.arange(262144, dtype=torch.int64) % 32768 if gather else None
    offsets = torch.arange(0, 262144 + 1, 262144 // groups, dtype=torch.int64)
    with caught(mod, "amax_kernel", sink):
        mod.amax(x, offsets, groups, rows=rows)


def norm_bwd_launch(sink, *, rows=16384, n=1024, rms=True):
    """The RMSNorm / LayerNorm backward over [rows, n] bf16 (``benchmarks.sizes``' dense stack: T=16384, H=1024)."""
    from fuseops.kernels.elementwise import norm as mod

    x = torch.empty(rows, n, dtype=torch.bfloat16)
    rstd = torch.empty(rows, dtype=torch.float32)
    with caught(mod, "norm_bwd_kernel", sink), mock.patch.object(mod, "sum_partials", lambda p, dtype: p):
        mod._norm_bwd(torch.empty_like(x), x, torch.empty(n, dtype=torch.bfloat16), None if rms else rstd, rstd,
                      False, not rms, rms)


def norm_fwd_launch(sink, *, rows=16384, n=1024, rms=True):
    """The RMSNorm / LayerNorm forward over [rows, n] bf16 (rows wider than 8192 read in chunks)."""
    from fuseops.kernels.elementwise import norm as mod

    x = torch.empty(rows, n, dtype=torch.bfloat16)
    with caught(mod, "norm_fwd_kernel", sink):
        mod._norm_fwd(x, torch.empty(n, dtype=torch.bfloat16), None if rms else torch.empty(n, dtype=torch.bfloat16),
                      1e-5, False, None, rms)


def norm_quantize_fwd_launch(sink, *, rows=16384, n=1024, rms=True, scaling="TENSOR"):
    """The RMSNorm / LayerNorm forward quantized in its epilogue (FP8, ``scaling`` a Scaling name)
    over [rows, n] bf16."""
    from fuseops.kernels.elementwise import norm_quantize as mod
    from fuseops.kernels.quantization.formats import Element, Scaling

    x, w = torch.empty(rows, n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
    with caught(mod, "norm_quantize_fwd_kernel", sink):
        mod._norm_quantize_fwd(x, w, None if rms else w, 1e-5, False, getattr(Scaling, scaling), Element.E4M3,
                               False, None, rms)


def activation_dbias_launch(sink, *, rows=4096, n=4096, act="GELU_TANH", cfg=None):
    """The activation backward + dbias over [rows, n] bf16 (``benchmarks.sizes``' dense stack), in the
    library's tile or ``cfg`` (a ReduceConfig)."""
    from fuseops.kernels.elementwise import activation as mod

    x = torch.empty(rows, n, dtype=torch.bfloat16)
    configs = mod._configs() if cfg is None else (mod._configs()[0], cfg)
    with caught(mod, "activation_bwd_dbias_kernel", sink), mock.patch.object(mod, "sum_partials", lambda p, dtype: p), \
            mock.patch.object(mod, "_configs", lambda: configs):
        mod.activation_bwd_dbias(x, torch.empty_like(x), getattr(mod.Activation, act))


CASES = {
    "quantize": quantize_launch,
    "norm_bwd": norm_bwd_launch,
    "norm_fwd": norm_fwd_launch,
    "norm_quantize_fwd": norm_quantize_fwd_launch,
    "activation_dbias": activation_dbias_launch,
    "amax": amax_launch,
    "gated_dgrad": gated_dgrad_launch,
    "gated_fwd": gated_fwd_launch,
    "blockwise_fwd": blockwise_fwd_launch,
    "blockwise_wgrad": blockwise_wgrad_launch,
    "bf16_wgrad": bf16_wgrad_launch,
    "triton_wgrad": triton_wgrad_launch,
    "tensor_scaled_fwd": tensor_scaled_fwd_launch,
    "tensor_scaled_wgrad": tensor_scaled_wgrad_launch,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=list(CASES))
    parser.add_argument("--sass", type=Path)
    parser.add_argument("--ptx", type=Path)
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=PYTHON",
                        help="keyword arguments of the case, e.g. "
                             "cfg=GatedGemmConfig(128,256,64,8,8,3,epilogue_parts=8)")
    args = parser.parse_args()
    sink: list = []
    from fuseops.kernels.elementwise.bias_grad import ReduceConfig
    from fuseops.kernels.gemm.grouped import GemmConfig
    from fuseops.kernels.gemm.grouped_gated import GatedGemmConfig
    from fuseops.kernels.quantization.quantize import QuantizeConfig

    names = dict(torch=torch, GemmConfig=GemmConfig, GatedGemmConfig=GatedGemmConfig, QuantizeConfig=QuantizeConfig,
                 ReduceConfig=ReduceConfig)
    CASES[args.case](sink, **{k: eval(v, names) for k, v in (kv.split("=", 1) for kv in args.set)})
    kernel, grid, kargs, kwargs = sink[0]
    compiled = compile_sm90(kernel, kargs, dict(kwargs))
    if args.ptx:
        args.ptx.write_text(compiled.asm["ptx"])
    print(report(compiled, args.sass))


if __name__ == "__main__":
    main()
