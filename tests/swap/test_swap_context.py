"""outcore.swap as a context manager and as an object: hooks on while active, none after,
also when nested and on exceptions; bad input gets a one-line error."""

import gc

import pytest
import torch
from torch import nn

import outcore
from outcore import OutcoreError
from outcore.swap import HostStore
from swap_testlib import (assert_same_grads, batch, hook_counts, loss_of, saved_hooks_top,
                          tiny_cnn, twin)

FORCE = dict(min_swap_bytes=1, force_copy=True)


def test_no_hooks_left_after_exit_and_model_unchanged():
    model = tiny_cnn()
    before, state = hook_counts(model), {k: v.clone() for k, v in model.state_dict().items()}
    params = [(p, p.data_ptr()) for p in model.parameters()]
    with outcore.swap(model, swap_params=True, **FORCE) as s:
        assert hook_counts(model) != before
        x, y = batch(4)
        with torch.no_grad():
            model.eval()
            model(x)
    model.train()
    assert hook_counts(model) == before
    assert saved_hooks_top() is None
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert all(p is q and p.untyped_storage().nbytes() == p.numel() * p.element_size()
               for (p, _), q in zip(params, model.parameters()))
    assert s.closed and "closed" in repr(s)


def test_object_form_with_close_in_a_loop():
    plain, swapped = tiny_cnn(), tiny_cnn()
    before = hook_counts(swapped)
    s = outcore.swap(swapped, **FORCE)
    for step in range(2):
        x, y = batch(4, seed=step)
        for m in (plain, swapped):
            m.zero_grad()
            loss_of(m, x, y).backward()
        assert_same_grads(plain, swapped)
    s.close()
    s.close()   # idempotent
    assert hook_counts(swapped) == before and s.report().forwards == 2


def two_part_cnn():
    net = tiny_cnn()
    return nn.Sequential(net[:4], net[4:])


def test_nested_swaps_innermost_packs_and_both_leave_clean():
    plain = two_part_cnn()
    swapped = twin(plain)
    before = hook_counts(swapped)
    x, y = batch(4)
    with outcore.swap(swapped, **FORCE) as outer:
        with outcore.swap(swapped[1], **FORCE) as inner:       # a sub-model
            with outcore.swap(swapped, **FORCE) as innermost:  # the same model again
                loss_of(swapped, x, y).backward()
            assert saved_hooks_top() is None
            loss_of(swapped, x, y).backward()
        loss_of(swapped, x, y).backward()
    for _ in range(3):
        loss_of(plain, x, y).backward()
    assert_same_grads(plain, swapped)
    assert innermost.report().offloaded_tensors > 0
    assert inner.report().offloaded_tensors > 0          # second pass: inner swaps its part
    assert outer.report().offloaded_tensors > inner.report().offloaded_tensors - 1
    assert hook_counts(swapped) == before and saved_hooks_top() is None


def test_exception_inside_the_block_leaves_the_model_clean():
    model = tiny_cnn()
    before = hook_counts(model)
    x, y = batch(4)
    with pytest.raises(RuntimeError, match="boom"):
        with outcore.swap(model, swap_params=True, **FORCE):
            loss_of(model, x, y)
            raise RuntimeError("boom")
    assert hook_counts(model) == before and saved_hooks_top() is None
    assert all(p.untyped_storage().nbytes() > 0 for p in model.parameters())


class Fails(nn.Module):
    def forward(self, x):
        raise ValueError("bad shape")


def test_exception_inside_forward_pops_the_saved_tensor_hooks():
    model = nn.Sequential(*tiny_cnn()[:4], Fails())
    before = hook_counts(model)
    x, _ = batch(4)
    with outcore.swap(model, swap_params=True, **FORCE) as s:
        with pytest.raises(ValueError, match="bad shape"):
            model(x)
        assert saved_hooks_top() is None          # popped by the always-called forward hook
        assert all(p.untyped_storage().nbytes() > 0 for p in model.parameters())
        ok = nn.Sequential(*model[:4])
        ok(x).sum().backward()                    # the rest still trains
    assert hook_counts(model) == before and s.report().forwards == 1


def test_shared_host_store_is_reused_across_swaps():
    store = HostStore(slab_bytes=4 << 20)
    model = tiny_cnn()
    x, y = batch(4)
    for _ in range(2):
        with outcore.swap(model, store=store, **FORCE):
            loss_of(model, x, y).backward()
    assert store.slabs == 1 and store.in_use_bytes == 0   # runs returned, slab kept
    store.release()
    assert store.slabs == 0 and store.reserved_bytes == 0


@pytest.mark.parametrize("call, err, text", [
    (lambda m: outcore.swap("model"), TypeError, "torch.nn.Module"),
    (lambda m: outcore.swap(m, gpu_memory="lots"), OutcoreError, "does not parse"),
    (lambda m: outcore.swap(m, min_swap_bytes=-1), OutcoreError, "must be a positive"),
    (lambda m: outcore.swap(m, min_swap_bytes=None), OutcoreError, "not a size"),
    (lambda m: outcore.swap(m, swap_params="yes"), TypeError, "True or False"),
    (lambda m: outcore.swap(m, prefetch="1GiB"), TypeError, "unknown option"),
    (lambda m: outcore.swap(m, gpu_memory="1GiB", reserve_bytes="2GiB"), OutcoreError,
     "must be below"),
    (lambda m: outcore.swap(m, store="x"), TypeError, "HostStore"),
])
def test_bad_input_gets_one_line_errors(call, err, text):
    model = tiny_cnn()
    before = hook_counts(model)
    with pytest.raises(err, match=text) as info:
        call(model)
    assert "\n" not in str(info.value)
    assert hook_counts(model) == before


def test_nested_parameter_swapping_is_refused_cleanly():
    model = two_part_cnn()
    before = hook_counts(model)
    with outcore.swap(model, swap_params=True, **FORCE):
        with pytest.raises(OutcoreError, match="swap_params=False"):
            outcore.swap(model[1], swap_params=True, **FORCE)
        other = nn.Sequential(nn.Linear(4, 4), model[0][0])     # one new, one taken
        with pytest.raises(OutcoreError, match="swap_params=False"):
            outcore.swap(other, swap_params=True, **FORCE)
        with outcore.swap(nn.Sequential(other[0]), swap_params=True, **FORCE):
            pass                                                 # the new one is free
        with outcore.swap(model[1], **FORCE):      # activations only: fine
            loss_of(model, *batch(4)).backward()
    assert hook_counts(model) == before


def test_report_summary_and_counts():
    model = tiny_cnn()
    x, y = batch(4)
    with outcore.swap(model, **FORCE) as s:
        loss_of(model, x, y).backward()
    r = s.report()
    text = r.summary()
    assert "to host" in text and "hidden" in text and len(text.splitlines()) >= 5
    assert r.saved_tensors >= (r.small_tensors + r.strided_tensors + r.kept_tensors
                               + r.deduplicated + r.offloaded_tensors)
    assert sum(r.by_module.values()) == r.bytes_to_host
    assert set(r.by_module) <= {n for n, _ in model.named_modules()}
    assert r.copy_s > 0 and r.hidden_s == 0.0     # on the CPU every copy is exposed


def test_host_limit_error_surfaces_and_leaves_clean():
    model = tiny_cnn()
    before = hook_counts(model)
    store = HostStore(slab_bytes=64 * 1024, limit=200_000)
    with pytest.raises(OutcoreError, match="host_memory") as info:
        with outcore.swap(model, store=store, **FORCE):
            loss_of(model, *batch(64)).backward()
    assert "\n" not in str(info.value)
    assert hook_counts(model) == before and saved_hooks_top() is None
    del info                                # its traceback holds the failed forward's graph
    gc.collect()
    assert store.in_use_bytes == 0          # ... whose runs then come back
