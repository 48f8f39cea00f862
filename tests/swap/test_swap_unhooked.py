"""A forward that fits runs without hooks: the last forward with the same inputs kept every
saved tensor and still fits the budget, so packing (Python work per saved tensor) is
skipped. Any change that can change the saved sizes (batch shape, autocast, train/eval,
a budget that no longer holds them) brings the hooks back; gradients never change."""

import pytest
import torch

import outcore
from swap_testlib import assert_same_grads, batch, hook_counts, loss_of, tiny_cnn, twin


def _step(model, x, y):
    model.zero_grad(set_to_none=True)
    loss_of(model, x, y).backward()


def test_second_forward_of_same_shape_is_unhooked_and_exact():
    model, plain = tiny_cnn(), None
    plain = twin(model)
    x, y = batch(4)
    s = outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True)
    _step(model, x, y)
    first = s.report()
    assert first.forwards == 1 and first.unhooked_forwards == 0
    assert first.saved_tensors > 0 and first.offloaded_tensors == 0
    _step(model, x, y)
    _step(plain, x, y)
    assert_same_grads(model, plain)
    second = s.report()
    assert second.unhooked_forwards == 1 and second.forwards == 1
    assert second.saved_tensors == first.saved_tensors   # nothing was packed
    s.close()


def test_a_new_batch_shape_or_mode_is_hooked_again():
    model = tiny_cnn()
    before = hook_counts(model)
    with outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True) as s:
        _step(model, *batch(4))
        _step(model, *batch(6))                    # new shape: hooked, new profile
        assert s.report().forwards == 2
        _step(model, *batch(6))                    # same as the last: unhooked
        assert s.report().unhooked_forwards == 1
        model.eval()
        with torch.no_grad():
            model(batch(6)[0])                     # eval + no_grad: another signature
        assert s.report().forwards == 3
        model.train()
    assert hook_counts(model) == before


def test_a_budget_that_does_not_hold_everything_stays_hooked():
    model = tiny_cnn()
    plain = twin(model)
    x, y = batch(8)
    with outcore.swap(model, gpu_memory="200KiB", reserve_bytes=0, prefetch_bytes=1,
                      min_swap_bytes=1, force_copy=True) as s:
        for _ in range(3):
            _step(model, x, y)
        rep = s.report()
    _step(plain, x, y)
    assert_same_grads(model, plain)
    assert rep.unhooked_forwards == 0 and rep.forwards == 3 and rep.offloaded_tensors > 0


def _swapping(model):
    return outcore.swap(model, gpu_memory="200KiB", reserve_bytes=0, prefetch_bytes=1,
                        min_swap_bytes=1, force_copy=True)


def test_unfreezing_layers_brings_the_hooks_back():
    """Frozen layers save nothing: the forwards that fit then say nothing of the same
    inputs once the layers train again (their activations no longer fit the budget)."""
    model = tiny_cnn()
    x, y = batch(8)
    for p in model[:-1].parameters():
        p.requires_grad_(False)
    with _swapping(model) as s:
        _step(model, x, y)
        _step(model, x, y)
        assert s.report().unhooked_forwards == 1
        for p in model.parameters():
            p.requires_grad_(True)
        _step(model, x, y)
        _step(model, x, y)
        rep = s.report()
    assert rep.unhooked_forwards == 1 and rep.forwards == 3 and rep.offloaded_tensors > 0


class _Raise(torch.nn.Module):
    on = False

    def forward(self, x):
        if self.on:
            raise RuntimeError("stopped")
        return x


def test_a_forward_that_raised_does_not_vouch_for_the_next():
    """A forward that raised part way saved only its first tensors: they fit, but the
    whole forward does not, so the next forward of the same inputs stays hooked."""
    model = tiny_cnn()
    stop = _Raise()
    model.insert(4, stop)
    x, y = batch(8)
    with _swapping(model) as s:
        stop.on = True
        with pytest.raises(RuntimeError, match="stopped"):
            model(x)
        stop.on = False
        _step(model, x, y)
        _step(model, x, y)
        rep = s.report()
    assert rep.unhooked_forwards == 0 and rep.offloaded_tensors > 0


class _Interruptible(torch.nn.Module):
    """The tiny CNN, raising KeyboardInterrupt inside forward while `stop` is set."""

    def __init__(self):
        super().__init__()
        self.net, self.stop = tiny_cnn(), False

    def forward(self, x):
        h = self.net[:3](x)
        if self.stop:
            raise KeyboardInterrupt
        return self.net[3:](h)


def _interrupt(model, x):
    model.stop = True
    try:
        model(x)
    except KeyboardInterrupt:
        pass
    model.stop = False


def test_a_forward_interrupted_by_ctrl_c_leaves_nothing_behind():
    """torch skips always-call hooks for KeyboardInterrupt: the next forward notices that
    the interrupted one is gone, so swapping goes on as before and no hook is left."""
    model = _Interruptible()
    plain = twin(model)
    x, y = batch(4)
    with outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True) as s:
        _interrupt(model, x)                      # hooked forward (first one)
        _step(model, x, y)
        hooked = s.report().forwards
        _interrupt(model, x)                      # unhooked forward (same inputs, fits)
        assert s.report().unhooked_forwards == 1
        _step(model, *batch(16))                  # a new shape must be hooked again
        assert s.report().forwards == hooked + 1
        saved = s.report().saved_tensors
        a = torch.ones(3, requires_grad=True)
        (a * a).sum().backward()                  # outside the model: nothing packed
        assert s.report().saved_tensors == saved
        assert s._depth == 0 and not s._frames and not s._stack
    _step(model, x, y)
    _step(plain, x, y)
    assert_same_grads(model, plain)


def test_ops_right_after_ctrl_c_are_not_swapped():
    """Between the interrupted forward and the next one, the first tensor the user's own
    code saves finds that forward gone: the hooks come off there, nothing of it is packed."""
    model = _Interruptible()
    x, _ = batch(4)
    with outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True) as s:
        _interrupt(model, x)
        assert s._depth == 1 and s._stack          # torch ran no always-call hook
        saved = s.report().saved_tensors
        a = torch.randn(64, requires_grad=True)
        y = torch.tanh(a * a)                      # saves a (twice) and tanh's output
        assert s._depth == 0 and not s._frames and not s._stack
        y.sum().backward()
        assert s.report().saved_tensors == saved
    b = a.detach().clone().requires_grad_()
    torch.tanh(b * b).sum().backward()
    assert torch.equal(a.grad, b.grad)


def test_a_save_by_autograd_after_ctrl_c_leaves_no_hook_behind():
    """The first save after the interrupted forward made inside a backward (a create_graph
    gradient): the engine puts the thread's hooks back after each node, so they are taken
    off at the next save outside it, and none stays pushed after close (session 47's
    review: they stayed for good and kept the model alive)."""
    import gc
    import weakref
    from swap_testlib import saved_hooks_top

    def run():
        model = _Interruptible()
        x, _ = batch(4)
        s = outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True)
        a = torch.randn(8, requires_grad=True)
        g = torch.nn.functional.softplus(a).sum()   # made before the interrupt
        _interrupt(model, x)
        (da,) = torch.autograd.grad(g, a, create_graph=True)   # softplus' backward saves
        assert torch.allclose(da, torch.sigmoid(a))
        torch.tanh(a).sum()                          # a save outside the engine
        assert s._depth == 0 and not s._stack and saved_hooks_top() is None
        s.close()
        return weakref.ref(model)
    ref = run()
    gc.collect()
    assert saved_hooks_top() is None and ref() is None


def test_a_forward_interrupted_on_another_thread_lets_this_one_run():
    """Ctrl-C reaches a forward run on a worker thread; the next forward runs on the main
    thread: it forgets the dead forward's hooks (on the worker's stack, which this thread
    cannot pop: torch asserted) and trains as plain PyTorch does."""
    from concurrent.futures import ThreadPoolExecutor
    model = _Interruptible()
    plain = twin(model)
    x, y = batch(4)
    with outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True) as s:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(_interrupt, model, x).result()
        assert s._depth == 1
        _step(model, x, y)
        assert s._depth == 0 and not s._stack
    _step(plain, x, y)
    assert_same_grads(model, plain)


def test_a_nested_call_is_still_nested():
    """A model calling itself inside its forward (recursion) is one forward, not a dead one."""
    class Rec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, depth=2):
            x = torch.relu(self.lin(x))
            return self(x, depth - 1) if depth else x
    model = Rec()
    with outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True) as s:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
        assert s.report().forwards == 1 and s._depth == 0


def test_an_unhooked_forward_that_fails_makes_the_next_one_hooked():
    """An out-of-memory error (here any error) in an unhooked forward: the retry is hooked."""
    model = tiny_cnn()
    x, y = batch(4)
    fail = [False]

    class Boom(RuntimeError):
        pass

    def boom(mod, args):
        if fail[0]:
            raise Boom
    handle = model[3].register_forward_pre_hook(boom)
    with outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True) as s:
        _step(model, x, y)
        fail[0] = True
        with pytest.raises(Boom):
            model(x)                               # unhooked, and it fails
        fail[0] = False
        assert s.report().unhooked_forwards == 1
        _step(model, x, y)                         # hooked again
        assert s.report().forwards == 2
    handle.remove()
