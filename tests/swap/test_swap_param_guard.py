"""swap_params with a parameter read outside its module's forward: a one-line error before
the read (which would segfault on freed storage), the swap left usable; reads of metadata
allowed; the check only on a forward signature not seen before."""

import pytest
import torch
from torch import nn

import outcore
from outcore import OutcoreError
from swap_testlib import twin

PARAMS = dict(min_swap_bytes=1, force_copy=True, swap_params=True)


class TiedHead(nn.Module):
    """The head reads the embedding's weight in the parent's forward (not through a module)."""

    def __init__(self, read):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.lin = nn.Linear(16, 16)
        self.read = read

    def forward(self, ids):
        h = self.lin(self.emb(ids))
        return self.read(self, h)


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("read,name,owner,op", [
    (lambda m, h: h @ m.emb.weight.t(), "emb.weight", "emb", "t"),
    # an elementwise read of freed storage is the one that segfaults without the guard
    (lambda m, h: h + m.lin.weight.sum(), "lin.weight", "lin", "sum"),
    (lambda m, h: torch.nn.functional.linear(h, m.lin.weight), "lin.weight", "lin", "linear"),
])
def test_read_outside_the_owner_is_refused_in_one_line(read, name, owner, op):
    model = TiedHead(read)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 50, (3, 7))
    with outcore.swap(model, **PARAMS) as s:
        with pytest.raises(OutcoreError) as e:
            model(ids)
        msg = _one_line(e)
        assert f"{name} was read by {op} outside the forward of {owner}" in msg
        assert "swap_params=False" in msg
        # the swap still works for a forward that keeps to the rule
        model.read = lambda m, h: h.sum()
        model(ids).backward()
    assert s.closed
    for k, v in model.state_dict().items():   # every parameter back, its values intact
        assert torch.equal(v, before[k]), k


def test_a_module_sharing_the_parameter_is_fine_and_matches_plain():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.head = nn.Linear(16, 50, bias=False)
            self.head.weight = self.emb.weight   # tied through a module: allowed

        def forward(self, ids):
            return self.head(torch.tanh(self.emb(ids)))

    plain = Tied()
    swapped = twin(plain)
    ids = torch.randint(0, 50, (3, 7))
    plain(ids).square().mean().backward()
    with outcore.swap(swapped, **PARAMS):
        swapped(ids).square().mean().backward()
    torch.testing.assert_close(swapped.emb.weight.grad, plain.emb.weight.grad)


def test_guard_runs_once_per_signature():
    depth = []
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    model[2].register_forward_pre_hook(
        lambda m, a: depth.append(torch._C._len_torch_function_stack()))
    with outcore.swap(model, **PARAMS):
        for shape in ((2, 8), (2, 8), (5, 8), (2, 8)):
            model(torch.randn(shape)).sum().backward()
    # guarded: the first (2, 8) and the first (5, 8); not the repeats
    assert [d > 0 for d in depth] == [True, False, True, False]
    assert torch._C._len_torch_function_stack() == 0   # nothing left pushed


def test_guard_is_popped_when_the_forward_raises():
    model = TiedHead(lambda m, h: h @ m.emb.weight.t())
    with outcore.swap(model, **PARAMS):
        with pytest.raises(OutcoreError):
            model(torch.randint(0, 50, (2, 3)))
        assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize("how", ["wrapped submodule", "wrapped model", "compiled in place"])
def test_a_compiled_module_is_refused_up_front(how):
    """Compiled code reads parameters without the hooks that fetch them (it failed inside
    dynamo or inductor); nothing is compiled here: the refusal comes before any forward."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    if how == "wrapped submodule":
        model[0] = torch.compile(model[0])
    elif how == "wrapped model":
        model = torch.compile(model)
    else:
        model[2].compile()
    with pytest.raises(OutcoreError, match="torch.compile'd.*swap_params=False") as e:
        outcore.swap(model, **PARAMS)
    _one_line(e)
    inner = getattr(model, "_orig_mod", model)
    assert all(not m._forward_pre_hooks for m in inner.modules())   # nothing left installed
    s = outcore.swap(model, min_swap_bytes=1, force_copy=True)   # activations alone: fine
    s.close()
