"""Triton (and, on Hopper, Gluon) kernels with their launchers, each launcher with a
plain-torch reference of the same signature beside it. This layer knows tensors only: no
modules, recipes or fusions.

| family | what |
| --- | --- |
| ``gemm/`` | GEMM main loops with their epilogues, dense and grouped (MoE), bf16 / fp16 / fp32 and quantized operands |
| ``hopper/`` | the warp-specialized Gluon GEMMs for sm_90 (FP8 blockwise, bf16 grouped wgrad) and their pipeline pieces |
| ``elementwise/`` | activations (plain and gated), norms, bias gradients, and their quantized-output variants |
| ``quantization/`` | number formats, quantized operands, amax, the quantize cast, the producers' quantize epilogue |
| ``moe/`` | MoE routing: permute token rows by expert, unpermute and combine |

``dispatch.py`` is the one table that decides which implementation serves each operation
(``python -m fuseops.kernels`` prints it); under torch.compile the grouped GEMMs
(``library.py``), the routing (``moe/traceable.py``) and the quantized kernels
(``quantized_ops/``) are ``torch.library`` custom ops that run it at run time;
``_triton.py`` holds the helpers every kernel shares and is the only module that reads
``TRITON_INTERPRET``; every launcher
starts its kernels through ``launch.py`` (``launch(kernel, grid, *args, **kw)``, Triton's
``kernel[grid](...)`` without its per-call binding once a specialization was seen). Each family's
docstring has a table of its kernels.
"""

# The modules are the package's public names; the package itself defines nothing.
__all__ = [
    "autodiff_state", "custom_op", "dense_dispatch", "dispatch", "dtypes", "elementwise", "gemm",
    "hopper", "launch", "launch_descriptors", "library", "moe", "quantization", "quantized_ops",
]
