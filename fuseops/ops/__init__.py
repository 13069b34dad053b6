"""Basic ops: each owns its parameters and spells out its forward and backward."""

from fuseops.exported_names import exported_dir
from fuseops.ops.activation import GELU, ActivationOp, ReLU, Sigmoid, SiLU, SReLU
from fuseops.ops.bias import Bias
from fuseops.ops.contract import OpContext, OpGrads, Role, Saved
from fuseops.ops.declared_activation import declare_activation
from fuseops.ops.gated import ClampedSwiGLU, GatedActivation, GeGLU, ReGLU, SReGLU, SwiGLU
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.ops.linear import Linear
from fuseops.ops.norm import LayerNorm, RMSNorm
from fuseops.ops.op import BasicOp
from fuseops.ops.parallel.comm import AllGather, AllReduce, ReduceScatter
from fuseops.ops.quantize import Quantize
from fuseops.ops.residual import AddExtraInput, MakeExtraOutput
from fuseops.ops.shape import Dropout, Identity, Reshape

__all__ = [
    "GELU",
    "ActivationOp",
    "AddExtraInput",
    "AllGather",
    "AllReduce",
    "BasicOp",
    "Bias",
    "ClampedSwiGLU",
    "Dropout",
    "GatedActivation",
    "GeGLU",
    "GroupedLinear",
    "Identity",
    "LayerNorm",
    "Linear",
    "MakeExtraOutput",
    "OpContext",
    "OpGrads",
    "Quantize",
    "RMSNorm",
    "ReGLU",
    "ReLU",
    "ReduceScatter",
    "Reshape",
    "Role",
    "SReGLU",
    "SReLU",
    "Saved",
    "SiLU",
    "Sigmoid",
    "SwiGLU",
    "declare_activation",
]


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
