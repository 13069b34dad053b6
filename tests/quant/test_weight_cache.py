"""The weight cache: one copy per weight version, never a stale one, no strong reference."""

import gc

import torch

from fuseops.quant import weight_cache


class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self, p):
        self.calls += 1
        return p.to(torch.float16) * 1


def test_reused_while_unchanged_and_rebuilt_after_each_kind_of_change():
    lin = torch.nn.Linear(8, 4)
    p = lin.weight
    build = Counter()
    first = weight_cache.derived(p, "cast", build)
    assert weight_cache.derived(p, "cast", build) is first and build.calls == 1
    changes = [
        lambda: torch.optim.SGD(lin.parameters(), lr=0.1).step(),
        lambda: p.detach().mul_(2),  # an in-place write through a view shares the version counter
        lambda: setattr(p, "data", torch.randn_like(p)),
        lambda: lin.load_state_dict({"weight": torch.randn(4, 8), "bias": torch.randn(4)}),
        lambda: lin.to(torch.float64),
    ]
    for q in lin.parameters():
        q.grad = torch.ones_like(q)
    for i, change in enumerate(changes):
        change()
        p = lin.weight
        got = weight_cache.derived(p, "cast", build)
        assert build.calls == i + 2, f"change {i} did not invalidate the copy"
        torch.testing.assert_close(got, p.to(torch.float16), rtol=0, atol=0)


def test_kinds_are_separate_and_share_invalidation():
    p = torch.nn.Parameter(torch.randn(4, 4))
    a = weight_cache.derived(p, "a", lambda t: t + 1)
    b = weight_cache.derived(p, "b", lambda t: t + 2)
    assert not torch.equal(a, b)
    with torch.no_grad():
        p.add_(1)
    assert torch.equal(weight_cache.derived(p, "a", lambda t: t + 1), p.detach() + 1)
    assert torch.equal(weight_cache.derived(p, "b", lambda t: t + 2), p.detach() + 2)


def test_disabled_builds_every_time_and_copies_carry_no_graph():
    p = torch.nn.Parameter(torch.randn(3))
    build = Counter()
    weight_cache.derived(p, "k", build, enabled=False)
    weight_cache.derived(p, "k", build, enabled=False)
    assert build.calls == 2
    assert not weight_cache.derived(p, "k", build).requires_grad


def test_no_reference_keeps_a_parameter_alive_and_bytes_are_counted():
    weight_cache.clear()
    p = torch.nn.Parameter(torch.randn(256, 256))
    weight_cache.derived(p, "cast", lambda t: t.to(torch.bfloat16))
    assert weight_cache.cached_bytes() == 256 * 256 * 2
    del p
    gc.collect()
    assert weight_cache.cached_bytes() == 0
    weight_cache.clear()


def test_a_new_storage_at_the_old_address_is_a_new_weight():
    # Two storages over one buffer: the allocator's reuse of a freed address, made certain.
    buf = bytearray(4 * 16)
    first = torch.frombuffer(buf, dtype=torch.float32).view(4, 4)
    second = torch.frombuffer(buf, dtype=torch.float32).view(4, 4)
    p = torch.nn.Parameter(torch.zeros(4, 4))
    p.data = first
    build = Counter()
    weight_cache.derived(p, "cast", build)
    second.copy_(torch.randn(4, 4))  # not through p: its version stays
    version = p._version
    p.data = second
    assert p.data_ptr() == first.data_ptr() and p._version == version
    got = weight_cache.derived(p, "cast", build)
    assert build.calls == 2
    torch.testing.assert_close(got, p.to(torch.float16), rtol=0, atol=0)


def test_every_optimizer_step_invalidates_even_without_a_version_bump():
    p = torch.nn.Parameter(torch.randn(4, 4))
    p.grad = torch.ones(4, 4)
    build = Counter()
    weight_cache.derived(p, "cast", build)
    version = p._version
    torch.optim.Adam([p], lr=0.1, fused=True).step()
    assert p._version == version  # the fused step writes without bumping the counter
    got = weight_cache.derived(p, "cast", build)
    assert build.calls == 2
    torch.testing.assert_close(got, p.to(torch.float16), rtol=0, atol=0)


def test_views_of_one_buffer_are_kept_apart_and_a_refill_through_the_base_invalidates():
    # FSDP2: parameters are views of one all-gather buffer, its storage freed and re-filled.
    flat = torch.randn(32)
    a = torch.nn.Parameter(flat[:16].view(4, 4))
    b = torch.nn.Parameter(flat[16:].view(4, 4))
    build = Counter()
    ca, cb = weight_cache.derived(a, "cast", build), weight_cache.derived(b, "cast", build)
    assert not torch.equal(ca, cb) and build.calls == 2
    storage = flat.untyped_storage()
    storage.resize_(0)
    storage.resize_(32 * 4)
    flat.copy_(torch.randn(32))
    for p in (a, b):
        torch.testing.assert_close(weight_cache.derived(p, "cast", build), p.to(torch.float16), rtol=0, atol=0)
    assert build.calls == 4


def test_lookup_finds_only_a_current_copy():
    p = torch.nn.Parameter(torch.randn(4))
    assert weight_cache.lookup(p, "cast") is None
    copy = weight_cache.derived(p, "cast", lambda t: t.half())
    assert weight_cache.lookup(p, "cast") is copy and weight_cache.lookup(p, "other") is None
    with torch.no_grad():
        p.add_(1)
    assert weight_cache.lookup(p, "cast") is None
