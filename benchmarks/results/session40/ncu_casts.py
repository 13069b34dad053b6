"""Session 40 probe (issue 24), run under Nsight Compute: the gathered cast of FC1's input at Qwen3-30B-A3B (262144
rows picked from [32768, 2048] tokens, row-wise and column-wise, grouped by 128 experts), blockwise (E4M3, 1x128
scales) then per-tensor (E4M3), two launches each, library tilings. Call 10: the blockwise one takes 1.017 ms, the
per-tensor one 0.567 (session 35), for the same bytes but the scales.

    ncu --kernel-name quantize_kernel ... python benchmarks/results/session40/ncu_casts.py
"""
import torch

from benchmarks.moe_quantize import routing
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.quantization import amax as ka
from fuseops.kernels.quantization import quantize as kq
from fuseops.kernels.quantization.formats import Element, Scaling, tensor_encode_scale

sizes, token_of_row = routing(32768, 128, 8, "cuda")
offsets = group_offsets(sizes)
tokens = torch.randn(1, 32768, 2048, device="cuda", dtype=torch.bfloat16)
kw = dict(element=Element.E4M3, rowwise=True, columnwise=True, rows=token_of_row)
enc = tensor_encode_scale(ka.amax(tokens[:, token_of_row], offsets, 128), Scaling.TENSOR, Element.E4M3)
for scaling, encode in ((Scaling.BLOCK, None), (Scaling.TENSOR, enc)):
    for _ in range(2):
        kq.quantize(tokens, offsets, encode, scaling=scaling, **kw)
torch.cuda.synchronize()
print("casts done")
