"""Session 65 probe (CPU): fuseops' RMSNorm / LayerNorm against torch.nn's and float64's at large finite inputs.
Both float32 formulas square x (sum of x^2, or of (x - mean)^2): past |x| ~ 1.8e19 / sqrt(N) the sum is inf, rstd
0 and the output 0 where float64's is the normalized row. fuseops equalled torch.nn there before session 65's
change (``SCALED_ROWS_FROM`` in kernels/elementwise/norm.py); it gives float64's values since.

    python benchmarks/results/session65/norm_overflow_probe.py
"""
import torch

import fuseops
from fuseops import ops

torch.manual_seed(0)
H = 64
for scale in (1e17, 1e18, 1e19, 3e38):
    x = torch.randn(4, H) * scale
    for name, mine, theirs in (("RMSNorm", ops.RMSNorm(H), torch.nn.RMSNorm(H, eps=1e-5)),
                               ("LayerNorm", ops.LayerNorm(H), torch.nn.LayerNorm(H))):
        y = fuseops.Sequential(mine)(x.clone().requires_grad_())
        t = theirs(x)
        t64 = theirs.double()(x.double())
        print(f"randn * {scale:7.0e} {name:9s} fuseops {y[0, :2].tolist()} torch.nn {t[0, :2].tolist()} "
              f"float64 {[round(v, 6) for v in t64[0, :2].tolist()]}")
