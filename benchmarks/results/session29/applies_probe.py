"""Session 29: which of compiled_sequential.applies' conditions holds under torch.compile on this
torch (on 2.11 the two operators were not used in call 2)."""
import torch

import fuseops
from fuseops import compiled_sequential as cs
from fuseops import ops
from fuseops.quant.autocast import current_recipe

print(torch.__version__, "has _is_compiling_flag:", hasattr(torch.compiler, "_is_compiling_flag"))
m = fuseops.Sequential(ops.Linear(4, 4))


def conditions(x):
    seq_ops = list(m._modules.values())
    return (x.dim() == 2, all(op.compiled_as_operator for op in seq_ops), torch.compiler.is_exporting(),
            torch._C._are_functorch_transforms_active(), current_recipe() is None, torch.compiler.is_compiling(),
            cs.applies(seq_ops, x, (), current_recipe()))


names = ("dim 2", "ops", "is_exporting", "functorch", "no recipe", "is_compiling", "applies")
print(dict(zip(names, torch.compile(conditions, backend="eager", fullgraph=True)(torch.randn(3, 4)))))
print("eager:", dict(zip(names, conditions(torch.randn(3, 4)))))
