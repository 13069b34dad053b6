"""fuseops.kernels.launch_descriptors: the kept descriptor expansion hands the C launcher
what Triton's own wrapper (``wrap_handle_tensordesc``) would, call after call, encoding a
map only for an (address, shape, strides, padding) not seen before at that position; CPU,
with a stand-in for the CUtensorMap encoding (``make_tensordesc_arg``)."""

from __future__ import annotations

import pytest
import torch
from triton.backends.nvidia import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels import launch_descriptors as ld

# A pointer, a descriptor lowered to TMA (metadata), an int, a descriptor without metadata
# (passed as pointer, shape and strides), a TMA descriptor, a constexpr.
SIGNATURE = {0: "*bf16", 1: "tensordesc<bf16[16, 32]>", 2: "i32", 3: "tensordesc<bf16[16, 32]>",
             4: "tensordesc<fp16[8, 8]>", 5: "constexpr"}
METAS = [{"block_size": [16, 32]}, None, {"block_size": [8, 8]}]
BASE = tuple(range(100, 113))  # the launcher's 13 arguments before the kernel's


@pytest.fixture
def encodings(monkeypatch):
    """Triton's make_tensordesc_arg with the map replaced by a tuple of what it encodes; the
    list of encodings made."""
    made = []
    real = driver.make_tensordesc_arg

    def fake(arg, meta):
        if meta is None:
            return real(arg, meta)
        made.append((arg.base.data_ptr(), tuple(arg.shape)))
        return [("map", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), arg.padding,
                 tuple(meta["block_size"])), *arg.shape, *arg.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", fake)
    monkeypatch.setattr(ld, "map_bytes", repr)
    return made


def _pair():
    """Triton's wrapper and ours over two recording C launchers."""
    theirs, ours = [], []
    triton_launch = driver.wrap_handle_tensordesc(lambda *a: theirs.append(a), SIGNATURE, METAS)
    our_launch = ld.descriptor_launch(driver.wrap_handle_tensordesc(lambda *a: ours.append(a), SIGNATURE, METAS))
    assert isinstance(our_launch, ld.DescriptorLaunch)
    return triton_launch, theirs, our_launch, ours


def _calls():
    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    y = torch.zeros(32, 64, dtype=torch.bfloat16)
    h = torch.zeros(16, 16, dtype=torch.float16)
    d = lambda t, block, padding="zero": TensorDescriptor(t, t.shape, t.stride(), block, padding)
    return [
        (7, d(x, [16, 32]), 5, d(y, [16, 32]), d(h, [8, 8]), 3),
        (7, d(x, [16, 32]), 5, d(y, [16, 32]), d(h, [8, 8]), 3),  # all kept
        (8, d(y, [16, 32]), 6, d(x, [16, 32]), d(h, [8, 8]), 3),  # another address at position 1
        (8, d(x[:32], [16, 32]), 6, d(x, [16, 32]), d(h[:, :8], [8, 8]), 3),  # same address, other shape
        (8, d(x, [16, 32], "nan"), 6, d(x, [16, 32]), d(h, [8, 8]), 3),  # other padding
        (7, d(x, [16, 32]), 5, d(y, [16, 32]), d(h, [8, 8]), 3),  # the first again
    ]


def test_expansion_equals_tritons_and_encodes_each_key_once(encodings):
    triton_launch, theirs, our_launch, ours = _pair()
    calls = _calls()
    for args in calls:
        triton_launch(*BASE, *args)
    encoded_by_triton = len(encodings)
    encodings.clear()
    for args in calls:
        our_launch(*BASE, *args)
    assert ours == theirs
    assert encoded_by_triton == 2 * len(calls)
    # Position 1: x, y, x[:32], x with nan padding; position 4: h and h[:, :8].
    assert len(encodings) == 4 + 2


def test_unhashable_shapes_are_expanded_every_call(encodings):
    triton_launch, theirs, our_launch, ours = _pair()
    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    h = torch.zeros(16, 16, dtype=torch.float16)
    args = (7, TensorDescriptor(x, list(x.shape), list(x.stride()), [16, 32]), 5,
            TensorDescriptor.from_tensor(x, [16, 32]), TensorDescriptor.from_tensor(h, [8, 8]), 3)
    for _ in range(3):
        triton_launch(*BASE, *args)
        our_launch(*BASE, *args)
    assert ours == theirs
    assert len(encodings) == 3 * 2 + 3 + 1


def test_verify_catches_a_kept_map_that_differs_from_a_fresh_one(encodings):
    _, _, our_launch, _ = _pair()
    args = _calls()[0]
    our_launch(*BASE, *args)
    our_launch.verify = True
    our_launch(*BASE, *args)  # kept and fresh agree
    our_launch.verify = False
    ((key, kept),) = our_launch.kept[0].items()
    our_launch.kept[0][key] = [("map", "stale"), *kept[1:]]
    our_launch(*BASE, *args)  # not verified: the kept expansion is trusted
    our_launch.verify = True
    with pytest.raises(ld.ExpansionMismatch):
        our_launch(*BASE, *args)


def test_kept_maps_are_bounded(encodings, monkeypatch):
    monkeypatch.setattr(ld, "MAX_MAPS_PER_DESCRIPTOR", 2)
    _, _, our_launch, _ = _pair()
    xs = [torch.zeros(16, 32, dtype=torch.bfloat16) for _ in range(5)]
    h = torch.zeros(16, 16, dtype=torch.float16)
    for x in xs:
        our_launch(*BASE, 7, TensorDescriptor.from_tensor(x, [16, 32]), 5,
                   TensorDescriptor.from_tensor(x, [16, 32]), TensorDescriptor.from_tensor(h, [8, 8]), 3)
    assert len(our_launch.kept[0]) <= 2


def test_other_launchers_are_left_as_they_are():
    plain = driver.wrap_handle_tensordesc(print, {0: "*bf16", 1: "i32"}, None)
    assert ld.descriptor_launch(plain) is plain
    assert ld.descriptor_launch(print) is print


def test_an_expansion_by_base_equals_expand_and_shares_its_kept_maps(encodings, monkeypatch):
    _, _, our_launch, _ = _pair()
    calls = _calls()
    expansions = {j: our_launch.expansion(j, calls[0][i]) for j, i in enumerate(our_launch.indices)}
    assert our_launch.indices == (1, 3, 4)
    # No metadata: the base, then values of the shape and strides alone (Triton's expansion).
    y = calls[0][3].base
    for other in (y, torch.ones_like(y)):
        desc = TensorDescriptor(other, y.shape, y.stride(), [16, 32])
        assert expansions[1](other) == our_launch.expand(1, desc) and expansions[1](other)[0] is other
    x = calls[0][1].base
    for other in (x, torch.zeros_like(x), x):
        desc = TensorDescriptor(other, x.shape, x.stride(), [16, 32])
        assert expansions[0](other) == our_launch.expand(0, desc)
    assert len(our_launch.kept[0]) == 2  # one map per address, shared with ``expand``
    assert our_launch.expansion(0, TensorDescriptor(x, list(x.shape), list(x.stride()), [16, 32])) is None
    ((key, kept),) = [item for item in our_launch.kept[0].items() if item[0][0] == x.data_ptr()]
    our_launch.kept[0][key] = [("map", "stale"), *kept[1:]]
    our_launch.verify = True
    with pytest.raises(ld.ExpansionMismatch):
        expansions[0](x)
    monkeypatch.setattr(ld, "MAX_MAPS_PER_DESCRIPTOR", 2)
    our_launch.verify = False
    bases = [torch.zeros_like(x) for _ in range(4)]
    for t in bases:
        expansions[0](t)
    assert 1 <= len(our_launch.kept[0]) <= 2


def test_every_launchers_descriptor_has_a_geometry_the_launch_keeps():
    """The descriptors our launchers build have hashable (shape, strides, padding): the key
    ``DescriptorLaunch`` keeps an encoded map under (a list shape made every grouped GEMM's
    ragged store encode its map afresh each launch, in programs too)."""
    from fuseops.kernels.gemm import grouped
    from fuseops.kernels.hopper import pipeline, wgrad
    t = torch.zeros(64, 32, dtype=torch.bfloat16)
    descriptors = [grouped.tensor_descriptor(t, [16, 32]), grouped.ragged_descriptor(t, [16, 32]),
                   wgrad._ragged(t, 32), pipeline.descriptor(t, 64, 32),
                   TensorDescriptor.from_tensor(t, [16, 32])]
    for d in descriptors:
        hash((d.shape, d.strides, d.padding))
        assert ld.DescriptorLaunch(None, [0], [{}], None).expansion(0, d) is not None
