"""Fused ops, each declaring the op pattern it replaces. ``REGISTRY`` lists them
explicitly; the fuser knows fusions only through it, and the property-based test suite
checks every entry against its basic ops."""

from fuseops.exported_names import exported_dir
from fuseops.fusions.backward_act_bias import BackwardBiasActivation, BackwardLinearBiasActivation
from fuseops.fusions.backward_act_linear import BackwardActivationLinear
from fuseops.fusions.backward_extra_output_linear import BackwardExtraOutputLinear
from fuseops.fusions.backward_gated_amax_linear import BackwardGatedAmaxLinear
from fuseops.fusions.backward_quantized_gated_mlp import BackwardQuantizedGatedMLP
from fuseops.fusions.forward_act_quantize_linear import ForwardActivationQuantizeLinear
from fuseops.fusions.forward_linear_add import ForwardLinearAddExtraInput
from fuseops.fusions.forward_linear_bias_act import ForwardLinearBiasActivation, ForwardLinearSeparateBiasActivation
from fuseops.fusions.forward_norm_quantize_linear import ForwardNormQuantizeLinear
from fuseops.fusions.forward_quantize_linear import ForwardQuantizeLinear
from fuseops.fusions.forward_quantized_grouped_mlp import ForwardQuantizedGroupedMLP
from fuseops.fusions.fusion import Fusion, OpMatch, PlanConfig, Stage, match
from fuseops.fusions.grouped_mlp import GroupedMLP

# Under a recipe GroupedMLP steps aside and ForwardQuantizedGroupedMLP takes the expert MLP
# (before ForwardActivationQuantizeLinear, which would take only its activation and FC2).
REGISTRY: list[Fusion] = [
    GroupedMLP(),
    ForwardQuantizedGroupedMLP(),
    ForwardLinearBiasActivation(),
    ForwardLinearSeparateBiasActivation(),
    ForwardLinearAddExtraInput(),
    ForwardQuantizeLinear(),
    ForwardNormQuantizeLinear(),
    ForwardActivationQuantizeLinear(),
    BackwardQuantizedGatedMLP(),
    BackwardGatedAmaxLinear(),
    BackwardLinearBiasActivation(),
    BackwardBiasActivation(),
    BackwardActivationLinear(),
    BackwardExtraOutputLinear(),
]

__all__ = [
    "REGISTRY",
    "BackwardActivationLinear",
    "BackwardBiasActivation",
    "BackwardExtraOutputLinear",
    "BackwardGatedAmaxLinear",
    "BackwardLinearBiasActivation",
    "BackwardQuantizedGatedMLP",
    "ForwardActivationQuantizeLinear",
    "ForwardLinearAddExtraInput",
    "ForwardLinearBiasActivation",
    "ForwardLinearSeparateBiasActivation",
    "ForwardNormQuantizeLinear",
    "ForwardQuantizeLinear",
    "ForwardQuantizedGroupedMLP",
    "Fusion",
    "GroupedMLP",
    "OpMatch",
    "PlanConfig",
    "Stage",
    "match",
]


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
