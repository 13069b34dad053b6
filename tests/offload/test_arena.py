"""The host arena: power-of-two blocks, reuse, fences carried back."""

import torch

from fuseops.offload.arena import MIN_BLOCK_BYTES, HostArena, block_capacity, host_arena


def test_capacities_are_powers_of_two_with_a_floor():
    assert block_capacity(0) == block_capacity(1) == MIN_BLOCK_BYTES
    assert block_capacity(MIN_BLOCK_BYTES + 1) == 2 * MIN_BLOCK_BYTES
    assert block_capacity(1 << 20) == 1 << 20
    assert block_capacity((1 << 20) + 1) == 1 << 21


def test_blocks_are_reused_by_capacity_and_carry_their_fence():
    arena = HostArena(pinned=False)
    a, b = arena.take(5000), arena.take(7000)
    assert a.capacity == b.capacity == 8192 and a.data.dtype == torch.uint8
    assert arena.allocations == 2 and arena.lent_bytes == arena.reserved_bytes == 16384
    arena.give(a, fence="copy-event")
    c = arena.take(6000)
    assert c is a and c.fence == "copy-event"
    assert arena.allocations == 2
    arena.give(b)
    arena.give(c)
    assert arena.lent_bytes == 0 and arena.free_bytes == 16384
    arena.take(100_000)
    assert arena.allocations == 3
    arena.clear()
    assert arena.free_bytes == 0 and arena.reserved_bytes == 131072


def test_cpu_devices_share_one_plain_arena():
    assert host_arena("cpu") is host_arena(torch.device("cpu"))
    assert not host_arena("cpu").pinned


def test_a_smaller_size_takes_a_larger_free_block_before_allocating():
    arena = HostArena(pinned=False)
    small, large, largest = arena.take(5000), arena.take(40_000), arena.take(200_000)
    for block in (small, large, largest):
        arena.give(block)
    assert arena.take(6000) is small
    assert arena.take(6000) is large  # 64 KiB, the smallest free that fits
    assert arena.take(30_000) is largest
    assert arena.allocations == 3
    assert arena.take(6000).capacity == 8192 and arena.allocations == 4
