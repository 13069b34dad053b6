"""Session 62: does torch.nn's own compiled model (inductor, CUDA) take batched cotangents
(``torch.autograd.grad(..., is_grads_batched=True)``)? fuseops' three compiled models raised
"Cannot access data pointer of Tensor that doesn't have storage" in inductor's
``copy_misaligned_inputs`` on CUDA (session 61's test, run in session 62's call 2)."""

import torch

for name, model in {"linear_gelu": torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)),
                    "linear": torch.nn.Linear(8, 8)}.items():
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        m = model.cuda()
        run = torch.compile(m, backend=backend, fullgraph=True)
        x = torch.randn(3, 8, device="cuda", requires_grad=True)
        y = run(x)
        try:
            got = torch.autograd.grad(y, [x], torch.randn(4, *y.shape, device="cuda"), is_grads_batched=True)
            print(name, backend, "ok", tuple(got[0].shape), flush=True)
        except Exception as e:  # noqa: BLE001 - the result
            print(name, backend, "raised", type(e).__name__, str(e)[:160], flush=True)
