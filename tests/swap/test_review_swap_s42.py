"""Session 42 review of outcore.swap: inputs a demanding user gives it, each checked against
plain PyTorch doing the same computation (gradients bit for bit)."""

import gc
import weakref
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import outcore
from outcore import OutcoreError
from outcore.swap import HostStore
from swap_testlib import assert_same_grads, twin

FORCE = dict(min_swap_bytes=1, force_copy=True)
PARAMS = dict(swap_params=True, **FORCE)


def _resident(model: nn.Module) -> bool:
    return all(p.untyped_storage().nbytes() == p.numel() * p.element_size()
               for p in model.parameters())


def _pair(model: nn.Module, step, **kw):
    """step(plain copy), then step(model) inside outcore.swap(model, **kw): equal grads,
    every parameter back on the device; returns the swap."""
    plain = twin(model)
    step(plain)
    with outcore.swap(model, **kw) as s:
        step(model)
    assert_same_grads(plain, model)
    assert _resident(model)
    return s


# ---- activations -----------------------------------------------------------------------

class Spectral(nn.Module):
    """FFT features: z * conj(z) saves z and its conjugate view (same address, shape,
    strides and version); a negative view likewise."""

    def __init__(self, neg: bool = False):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.neg = neg

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        if self.neg:
            return (h * torch._neg_view(h)).sum()
        z = torch.fft.rfft(h)
        return (z * z.conj()).real.sum()


@pytest.mark.parametrize("neg", [False, True])
def test_a_conjugate_or_negative_view_is_not_served_as_its_base(neg):
    x = torch.randn(8, 16)
    _pair(Spectral(neg), lambda m: m(x).backward(), **FORCE)


class GraphConv(nn.Module):
    """A GCN layer: the sparse adjacency matrix is saved by torch.sparse.mm."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        i = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 0, 4]])
        self.adj = torch.sparse_coo_tensor(i, torch.rand(5), (8, 8)).coalesce()

    def forward(self, x):
        return torch.sparse.mm(self.adj, torch.tanh(self.lin(x))).pow(2).sum()


def test_a_sparse_saved_tensor_is_left_in_place():
    x = torch.randn(8, 16)
    s = _pair(GraphConv(), lambda m: m(x).backward(), **FORCE)
    assert s.report().offloaded_tensors > 0


class TwoHeads(nn.Module):
    """Returns (features, logits); a loss on both reaches the features' node late."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())

    def forward(self, x):
        f = self.body(x)
        return f, self.head(f)


def test_a_second_output_does_not_start_the_same_backward_again():
    x = torch.randn(16, 32)

    def step(m):
        f, out = m(x)
        (out.pow(2).sum() + f.pow(2).sum()).backward(retain_graph=True)

    s = _pair(TwoHeads(), step, trace=True, prefetch_bytes=2048, **FORCE)
    r = s.report()
    assert r.bytes_to_device == r.bytes_to_host > 0    # each came back once, not twice
    fetched = [i for kind, _, i, _ in s.trace if kind in ("fetch", "prefetch")]
    assert len(fetched) == len(set(fetched))


class Stops(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        raise KeyboardInterrupt   # Ctrl-C: torch runs no always-call hook
        return self.b(h)


def test_ctrl_c_inside_forward_leaves_no_host_memory_held():
    model = Stops()
    x = torch.randn(32, 64)
    with pytest.raises(KeyboardInterrupt):
        with outcore.swap(model, **FORCE) as s:
            model(x)
    gc.collect()
    assert s.report().offloaded_tensors > 0
    assert s.store.in_use_bytes == 0 and s.store.reserved_bytes == 0


# ---- parameters ------------------------------------------------------------------------

def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 1))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.trunk, self.head, self.reentrant = mlp(), nn.Linear(1, 4), reentrant

    def forward(self, x):
        return self.head(checkpoint(self.trunk, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [False, True])
def test_parameters_with_activation_checkpointing_inside_the_model(reentrant):
    x = torch.randn(8, 16, requires_grad=True)
    _pair(Checkpointed(reentrant), lambda m: m(x).pow(2).sum().backward(), **PARAMS)


@dataclass
class Out:
    h: torch.Tensor


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        return Out(torch.tanh(x @ self.w))   # an output pytree cannot look into


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x).h
        return self.head(x)


def test_parameters_of_a_module_returning_a_dataclass():
    x = torch.randn(4, 16)
    _pair(Blocks(), lambda m: m(x).sum().backward(), param_prefetch_bytes=1, **PARAMS)


class SharesWithChild(nn.Module):
    """The parent owns its child's weight too (assigned as an attribute) and uses it after
    the child's forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.w = self.lin.weight

    def forward(self, x):
        return torch.tanh(torch.tanh(self.lin(x)) @ self.w.t()).sum()


def test_a_parameter_owned_by_a_parent_and_its_child():
    x = torch.randn(4, 16)
    _pair(SharesWithChild(), lambda m: m(x).backward(), **PARAMS)


def test_a_module_pre_hook_that_reads_the_weights():
    def make():
        torch.manual_seed(0)
        m = mlp()
        with pytest.warns(FutureWarning):
            nn.utils.weight_norm(m[2])   # a forward pre-hook computes weight from g and v
        return m

    plain, swapped = make(), make()   # (deepcopy refuses weight_norm's non-leaf weight)
    x = torch.randn(4, 16)
    plain(x).sum().backward()
    with outcore.swap(swapped, **PARAMS):
        swapped(x).sum().backward()
    assert_same_grads(plain, swapped)


def test_transformer_layers_with_multihead_attention():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(2, 5, 16)
    _pair(model, lambda m: m(x).sum().backward(), **PARAMS)
    plain = twin(model).eval()
    with outcore.swap(model.eval(), **PARAMS), torch.no_grad():
        assert torch.equal(model(x), plain(x))


def test_a_swap_never_closed_does_not_keep_its_model_alive():
    from torch.optim.optimizer import _global_optimizer_pre_hooks
    before = set(_global_optimizer_pre_hooks)
    model = mlp()
    s = outcore.swap(model, **PARAMS)
    model(torch.randn(4, 16)).sum().backward()
    with pytest.raises(OutcoreError, match=r"not closed.*close\(\) the other"):
        outcore.swap(model, **PARAMS)    # not nested: the message says what to do
    ref = weakref.ref(model[0].weight)
    del model, s
    gc.collect()
    assert ref() is None
    other = mlp()
    opt = torch.optim.SGD(other.parameters(), lr=0.1)
    other(torch.randn(4, 16)).sum().backward()
    opt.step()   # the dead swap's optimizer hook does nothing
    for key in set(_global_optimizer_pre_hooks) - before:   # the dead swap's (a no-op)
        _global_optimizer_pre_hooks.pop(key)


# ---- HostStore ---------------------------------------------------------------------------

def test_host_store_takes_sizes_as_swap_does():
    store = HostStore(slab_bytes="1MiB", limit="64MiB")
    assert (store.slab_bytes, store.limit) == (1 << 20, 64 << 20)
    model = mlp()
    x = torch.randn(4, 16)
    _pair(model, lambda m: m(x).sum().backward(), store=store, **FORCE)
    for kw in (dict(slab_bytes=-1), dict(limit="lots"), dict(slab_bytes=None)):
        with pytest.raises(OutcoreError) as info:
            HostStore(**kw)
        assert "\n" not in str(info.value)
