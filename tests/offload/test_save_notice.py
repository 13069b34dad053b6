"""The executor's save notice (``ops/executor/save_notice.py``) meeting the scheduler: a
noticed tensor is recorded (and may start its copy) before its save, the save finds that
record, a change in place between the two is saved afresh, a notice whose save never
comes is dropped with its group, and notices reach only the context whose hooks will
take the saves."""

import gc
import weakref

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.offload import offload_activations
from fuseops.offload import scheduler as scheduler_module
from fuseops.offload.records import Stored
from fuseops.ops.executor import save_notice
from tests.offload.test_moe import assert_same, moe_stack, moe_step


class NoticedThenSaved(torch.autograd.Function):
    """Makes ``t = x * 3``, notices it as the executor would, runs ``between(t)`` (more
    work, or a change in place), then saves it as the forward ends; backward returns
    ``dy * t`` from what came back."""

    @staticmethod
    def forward(ctx, x, between):
        t = x * 3
        receiver = save_notice.current_receiver()
        if receiver is not None:
            receiver([t])
        between(t)
        ctx.save_for_backward(t)
        return x * 2

    @staticmethod
    def backward(ctx, dy):
        (t,) = ctx.saved_tensors
        return dy * t, None


def _step(between, offload=True, **config):
    x = torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32).div(100).requires_grad_()
    config = {"min_tensor_bytes": 0, "keep_last": 0, "group_budget_bytes": None} | config
    handle = None
    if offload:
        with offload_activations(**config) as handle:
            y = NoticedThenSaved.apply(x, between)
    else:
        y = NoticedThenSaved.apply(x, between)
    y.sum().backward()
    return x.grad, handle.stats if handle is not None else None


def _spy(monkeypatch, name):
    """Calls of ``Scheduler.<name>``, in order, logged into the returned list."""
    calls = []
    real = getattr(scheduler_module.Scheduler, name)

    def spy(self, *args, **kwargs):
        calls.append(name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(scheduler_module.Scheduler, name, spy)
    return calls


def test_a_noticed_tensor_starts_its_copy_at_the_notice_and_moves_once(monkeypatch):
    events = _spy(monkeypatch, "notice")
    monkeypatch.setattr(scheduler_module.Scheduler, "_offload", _logged(events, scheduler_module.Scheduler._offload))
    monkeypatch.setattr(scheduler_module.Scheduler, "pack", _logged(events, scheduler_module.Scheduler.pack, "pack"))
    want, _ = _step(lambda t: None, offload=False)
    got, stats = _step(lambda t: None)
    assert torch.equal(got, want)
    # The copy was issued inside the notice, before the save; the save issued none.
    assert events == ["notice", "_offload", "pack"]
    nbytes = 64 * 32 * 4
    assert stats["storages_offloaded"] == 1 and stats["bytes_offloaded"] == nbytes == stats["bytes_reloaded"]
    assert stats["tensors_offloaded"] == 1 and stats["tensors_skipped"] == 0


def _logged(events, real, name="_offload"):
    def logged(self, *args, **kwargs):
        # A group moving from its start offloads its (empty) record list once then.
        if name != "_offload" or args[0]:
            events.append(name)
        return real(self, *args, **kwargs)

    return logged


def test_the_notice_changes_neither_what_moves_nor_the_gradients_of_a_kept_group(monkeypatch):
    # keep_last=1: the only group is kept; its record made at the notice is the one the
    # save uses, and is counted once, as kept.
    want, _ = _step(lambda t: None, offload=False)
    got, stats = _step(lambda t: None, keep_last=1)
    monkeypatch.setattr(scheduler_module.Scheduler, "notice", lambda self, tensors: None)
    _, unnoticed = _step(lambda t: None, keep_last=1)
    assert torch.equal(got, want)
    assert stats == unnoticed and stats["skipped_kept"] == 1


def test_a_change_in_place_between_notice_and_save_is_saved_afresh():
    # The copy started at the notice holds the old value: the save sees another version
    # and records the tensor again, so backward reads the changed value, as autograd does.
    want, _ = _step(lambda t: t.add_(1), offload=False)
    got, stats = _step(lambda t: t.add_(1))
    assert torch.equal(got, want)
    nbytes = 64 * 32 * 4
    # The stale copy and the fresh one; only the fresh one comes back.
    assert stats["bytes_offloaded"] == 2 * nbytes and stats["bytes_reloaded"] == nbytes
    assert stats["tensors_offloaded"] == 1


@pytest.mark.parametrize("keep_last", [0, 1])
def test_a_notice_whose_save_never_comes_is_dropped_with_its_group(monkeypatch, keep_last):
    made = []
    real_init = Stored.__init__

    def init(self, *args):
        real_init(self, *args)
        made.append(weakref.ref(self))

    monkeypatch.setattr(Stored, "__init__", init)

    def fail(t):
        raise RuntimeError("forward failed")

    x = torch.randn(64, 32, requires_grad=True)
    nbytes = 64 * 32 * 4
    with offload_activations(min_tensor_bytes=0, keep_last=keep_last, group_budget_bytes=None) as handle:
        scheduler = handle._scope
        with handle.group():
            with pytest.raises(RuntimeError, match="forward failed"):
                NoticedThenSaved.apply(x, fail)
            assert len(scheduler._noticed) == 1
        # The group ended: the record is in no group; its bytes are held no more
        # (keep_last=0: the copy the notice started holds them until it settles, as
        # the next group starts).
        assert scheduler._noticed == {} and all(not g.live() for g in scheduler._groups)
        assert scheduler._held == (nbytes if keep_last == 0 else 0)
        # The scheduler still works: a later group saves and moves as usual.
        with handle.group():
            y = NoticedThenSaved.apply(x, lambda t: None)
            # Only the new record's bytes, if any, are held (keep_last=0: its own copy
            # has passed, on the CPU at once).
            assert scheduler._held == (0 if keep_last == 0 else nbytes) and len(made) == 2
    gc.collect()
    assert made[0]() is None
    y.sum().backward()
    assert torch.equal(x.grad, x.detach() * 3)
    assert handle.stats["bytes_reloaded"] == (nbytes if keep_last == 0 else 0)


def _sequential():
    torch.manual_seed(0)
    return fuseops.Sequential(ops.Linear(32, 64), ops.GELU(), ops.Linear(64, 32))


def test_no_notice_without_a_backward_or_under_other_saved_tensor_hooks(monkeypatch):
    calls = _spy(monkeypatch, "notice")
    model, x = _sequential(), torch.randn(16, 32, requires_grad=True)
    with offload_activations(min_tensor_bytes=0) as handle:
        with torch.no_grad():
            model(x)
        # The saves go to the inner hooks (a checkpoint does the same): no record is
        # made for saves this context will never see.
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            model(x).sum().backward()
        assert calls == []
        model(x).sum().backward()
    assert calls and handle.stats["tensors_offloaded"] + handle.stats["tensors_skipped"] > 0


def test_the_receiver_is_registered_only_while_a_context_is_active():
    assert save_notice.current_receiver() is None
    with offload_activations():
        assert save_notice.current_receiver() is not None
        with offload_activations(enabled=False):
            assert save_notice.current_receiver() is not None
    assert save_notice.current_receiver() is None


def test_a_moe_stack_copies_its_experts_saves_at_their_notices_with_bitwise_gradients(monkeypatch):
    # The fused expert MLP notices x_sorted before its GEMMs and z between them; every
    # group moving as it saves (keep_last=0), their copies are issued from those notices.
    inside, depth = [], [0]
    real_notice, real_offload = scheduler_module.Scheduler.notice, scheduler_module.Scheduler._offload

    def notice(self, tensors):
        depth[0] += 1
        try:
            return real_notice(self, tensors)
        finally:
            depth[0] -= 1

    def offload(self, records, group, after, budget):
        if records and depth[0]:
            inside.append(sum(s.nbytes for s in records))
        return real_offload(self, records, group, after, budget)

    monkeypatch.setattr(scheduler_module.Scheduler, "notice", notice)
    monkeypatch.setattr(scheduler_module.Scheduler, "_offload", offload)
    layers = moe_stack(2, 64, 48, 4, 2)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    want, _ = moe_step(layers, x, None, None)
    got, stats = moe_step(layers, x, None, {"min_tensor_bytes": 0, "keep_last": 0, "group_budget_bytes": None})
    assert_same(got, want)
    # Per layer, x_sorted (64 rows x top-2 x 64, bf16) and z (128 x 96, bf16).
    assert sorted(inside) == sorted([128 * 64 * 2, 128 * 96 * 2] * 2)
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] > sum(inside)



class NoticedThenSavedAs(torch.autograd.Function):
    """As ``NoticedThenSaved``, saving ``as_saved(t)`` (``t`` itself, or another tensor
    object on its storage) after ``between(t)``; backward returns ``dy * saved``."""

    @staticmethod
    def forward(ctx, x, between, as_saved):
        t = x * 3
        receiver = save_notice.current_receiver()
        if receiver is not None:
            receiver([t])
        between(t)
        ctx.save_for_backward(as_saved(t))
        return x * 2

    @staticmethod
    def backward(ctx, dy):
        (saved,) = ctx.saved_tensors
        return dy * saved, None, None


def _step_as(between, as_saved, offload=True):
    x = torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32).div(100).requires_grad_()
    config = {"min_tensor_bytes": 0, "keep_last": 0, "group_budget_bytes": None}
    with offload_activations(**config, enabled=offload) as handle:
        y = NoticedThenSavedAs.apply(x, between, as_saved)
    y.sum().backward()
    return x.grad, handle.stats


def test_a_storage_marked_between_notice_and_save_stays_where_it_is():
    # The save of the very tensor noticed re-reads the storage's marks: marked after
    # its notice (whose copy has started), it is kept, as a save without a notice is.
    def mark(t):
        fuseops.offload.mark_not_offload(t)

    want, _ = _step_as(mark, lambda t: t, offload=False)
    got, stats = _step_as(mark, lambda t: t)
    assert torch.equal(got, want)
    assert stats["skipped_marked"] == stats["tensors_skipped"] == 1 and stats["tensors_offloaded"] == 0
    # The notice's copy was issued; nothing came back.
    assert stats["bytes_offloaded"] == 64 * 32 * 4 and stats["bytes_reloaded"] == 0


def test_another_tensor_on_a_noticed_storage_is_decided_afresh_at_its_save():
    # Saved as a negative view of the noticed tensor: not the object noticed, so its
    # save is checked in full (a negative view stays: not a plain tensor to rebuild).
    want, _ = _step_as(lambda t: None, torch._neg_view, offload=False)
    got, stats = _step_as(lambda t: None, torch._neg_view)
    assert torch.equal(got, want)
    assert stats["skipped_unsupported"] == stats["tensors_skipped"] == 1 and stats["tensors_offloaded"] == 0


def test_a_tensor_noticed_again_after_a_change_in_place_is_recorded_again_at_that_notice(monkeypatch):
    # Noticed early, changed, noticed again (a fused step's notices): the second notice
    # sees another version and records it afresh, its copy issued there, not at the save.
    events = _spy(monkeypatch, "notice")
    monkeypatch.setattr(scheduler_module.Scheduler, "_offload", _logged(events, scheduler_module.Scheduler._offload))
    monkeypatch.setattr(scheduler_module.Scheduler, "pack", _logged(events, scheduler_module.Scheduler.pack, "pack"))

    def change_and_notice_again(t):
        t.add_(1)
        save_notice.current_receiver()([t])

    want, _ = _step_as(lambda t: t.add_(1), lambda t: t, offload=False)
    events.clear()
    got, stats = _step_as(change_and_notice_again, lambda t: t)
    assert torch.equal(got, want)
    assert events == ["notice", "_offload", "notice", "_offload", "pack"]
    nbytes = 64 * 32 * 4
    assert stats["bytes_offloaded"] == 2 * nbytes and stats["bytes_reloaded"] == nbytes
