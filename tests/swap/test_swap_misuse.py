"""What a careless or unlucky user does to a swap: in-place changes of saved tensors, a
backward that raises, a swap that could not be built, a `with` entered twice or after
close, sizes under one byte. Swapping must behave as plain PyTorch does, or refuse in
one line."""

import pytest
import torch
from torch import nn

import outcore
from outcore import OutcoreError
from swap_testlib import assert_same_grads, hook_counts, twin

FORCE = dict(min_swap_bytes=1, force_copy=True)


class ScalesInPlace(nn.Module):
    """sigmoid saves its output, which is then doubled in place: autograd must refuse."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        y = torch.sigmoid(self.lin(x))
        y.mul_(2)
        return y.sum(), y


@pytest.mark.parametrize("kw", [
    {},                                         # CPU tensors: left in place
    dict(gpu_memory="1GiB", **FORCE),           # kept by the budget
    dict(min_swap_bytes="1MiB", force_copy=True),   # too small to swap
    FORCE,                                      # offloaded (the tensor is still alive)
])
def test_in_place_change_of_a_saved_tensor_raises_as_plain_pytorch(kw):
    model = ScalesInPlace()
    x = torch.randn(8, 16)
    loss, _ = model(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with outcore.swap(model, **kw) as s:
        loss, _ = model(x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
            loss.backward()
    assert "\n" not in str(info.value) and s.report().saved_tensors > 0


def test_no_false_alarm_for_in_place_ops_autograd_allows():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True),
                          nn.Linear(16, 16), nn.Tanh())
    swapped = twin(plain)
    x = torch.randn(8, 16)
    for m in (plain, swapped):
        with outcore.swap(m, **FORCE) if m is swapped else torch.enable_grad():
            y = m(x) + m(2 * x)          # BatchNorm's running stats change twice,
            y.add_(1).sum().backward()   # the inplace ReLU runs, y is saved by no one
    assert_same_grads(plain, swapped)


class Boom(torch.autograd.Function):
    fail = True

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        if Boom.fail:
            raise ValueError("boom in backward")
        return g


class FrozenTrunk(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(*(nn.Linear(16, 16) for _ in range(3))).requires_grad_(False)
        self.head = nn.Linear(16, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.tanh(Boom.apply(self.head(torch.tanh(self.trunk(x))))))


def test_after_a_backward_that_raised_parameters_still_come_back():
    """The end-of-backward callback of a failed backward never runs: the next backward
    must queue its own, or the frozen trunk (which backward never reaches) stays in host
    memory with empty device storage."""
    model = FrozenTrunk()
    x = torch.randn(8, 16)
    with outcore.swap(model, swap_params=True, param_prefetch_bytes=1, **FORCE):
        Boom.fail = True
        with pytest.raises(ValueError, match="boom"):
            model(x).sum().backward()
        Boom.fail = False
        for _ in range(2):
            model(x).sum().backward()
            assert all(p.untyped_storage().nbytes() == p.numel() * p.element_size()
                       for p in model.parameters())


def test_a_swap_that_could_not_be_built_lets_go_of_the_parameters():
    model = nn.Sequential(*(nn.Linear(256, 256) for _ in range(3)))
    plain = twin(model)
    before = hook_counts(model)
    with pytest.raises(OutcoreError, match="host_memory"):
        outcore.swap(model, swap_params=True, host_memory="300KiB", slab_bytes="64KiB", **FORCE)
    assert hook_counts(model) == before
    x = torch.randn(4, 256)
    with outcore.swap(model, swap_params=True, **FORCE) as s:   # not "already swapped"
        model(x).sum().backward()
    plain(x).sum().backward()
    assert_same_grads(plain, model) and s.report().param_bytes_to_host > 0


def test_with_nested_on_one_swap_and_after_close():
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    before = hook_counts(model)
    x = torch.randn(4, 16)
    s = outcore.swap(model, **FORCE)
    with s:
        with s:
            model(x).sum().backward()
        assert not s.closed                  # the outer block still swaps
        model(x).sum().backward()
    assert s.closed and s.report().forwards == 2 and hook_counts(model) == before
    with pytest.raises(OutcoreError, match="closed") as info:
        with s:
            pass
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kw", [dict(gpu_memory=0.5), dict(min_swap_bytes=0.25),
                                dict(prefetch_bytes=0.9), dict(slab_bytes=0.1)])
def test_sizes_under_one_byte_are_refused(kw):
    with pytest.raises(OutcoreError, match="less than one byte") as info:
        outcore.swap(nn.Linear(2, 2), **kw)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("zero", [0, 0.0, "0", "0GiB", " 0 MiB"])
def test_a_zero_reserve_may_be_written_as_a_string(zero):
    with outcore.swap(nn.Linear(2, 2), gpu_memory="1GiB", reserve_bytes=zero) as s:
        assert s.config.reserve_bytes == 0
    with pytest.raises(OutcoreError):
        outcore.swap(nn.Linear(2, 2), reserve_bytes=False)


class SavesInRoot(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.head = nn.Linear(32, 32)

    def forward(self, x):
        y = torch.relu(self.lin(x))      # lin saves x; the root saves y ...
        return self.head(torch.sigmoid(y)).sum()   # ... and sigmoid's output


def test_by_module_names_the_module_whose_forward_saved():
    model = SavesInRoot()
    with outcore.swap(model, **FORCE) as s:
        for _ in range(2):
            model(torch.randn(16, 32)).backward()
    one = 16 * 32 * 4
    assert s.report().by_module == {"lin": 2 * one, "": 4 * one}


def test_summary_claims_no_hidden_copies_when_copies_were_not_timed():
    model = SavesInRoot()
    with outcore.swap(model, timing=False, **FORCE) as s:
        model(torch.randn(16, 32)).backward()
    r = s.report()
    assert r.offloaded_tensors > 0 and r.copy_s == 0.0
    assert "hidden" not in r.summary() and "not timed" in r.summary()


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return torch.exp(x).sum()    # exp saves its output: the root's own save


def test_by_module_names_nested_modules_and_hooks_no_submodule():
    """by_module reads the innermost running module off the stack (where.py): the nested
    Linear that saved its input, the Tanh its output, the root its exp; and no submodule
    carries a hook of the swap (a hook on each module cost every forward, the ones that
    swap nothing too, about 3% of ResNet-152's step)."""
    model = Nested()
    before = hook_counts(model)
    with outcore.swap(model, **FORCE) as s:
        assert hook_counts(model)[1:] == before[1:]   # the root's hooks only
        model(torch.randn(8, 32)).backward()
    one = 8 * 32 * 4
    # each Linear saves its input (the root's x for blocks.0, the Tanh output before it
    # for blocks.1: one tensor, saved first by that Tanh); each Tanh and the exp their output
    assert s.report().by_module == {"blocks.0.0": one, "blocks.0.1": one,
                                    "blocks.1.1": one, "": one}
    assert hook_counts(model) == before


def test_by_module_names_a_shared_module_by_a_name_named_modules_lists():
    """A module shared under two names (weights tied by reuse) is reported under its first
    name, the one model.named_modules() gives (not the last alias, which it leaves out)."""
    lin = nn.Linear(16, 16)
    model = nn.Sequential(lin, nn.Tanh(), lin)
    with outcore.swap(model, **FORCE) as s:
        model(torch.randn(4, 16)).sum().backward()
    one = 4 * 16 * 4
    # x, saved by lin's first call ("0"); the Tanh's output, saved by the Tanh ("1") and
    # again by lin's second call (deduplicated)
    assert s.report().by_module == {"0": one, "1": one}
    assert set(s.report().by_module) <= {n for n, _ in model.named_modules()}


@pytest.mark.parametrize("swap_params", [False, True])
def test_a_closed_swap_does_not_keep_replaced_parameters_alive(swap_params):
    """The parameter list read at swap() (and swap_params' slots) are let go at close: a
    swap kept for its report must not hold the weights load_state_dict(assign=True)
    replaced afterwards."""
    import gc
    import weakref
    model = nn.Sequential(nn.Linear(32, 32))
    with outcore.swap(model, swap_params=swap_params, **FORCE) as s:
        model(torch.randn(4, 32)).sum().backward()
    old = weakref.ref(model[0].weight)
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    gc.collect()
    assert old() is None
    assert s.report().offloaded_tensors > 0
