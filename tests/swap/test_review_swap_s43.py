"""Session 43 review of the swap_params read guard (param_guard.py): models plain PyTorch
runs that the guard must let through (checked against plain PyTorch, bit for bit), reads of
a swapped-out parameter it must refuse in one line (they crashed or failed deep in torch),
and torch's function-mode stack left as the user had it."""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

import outcore
from outcore import OutcoreError
from swap_testlib import assert_same_grads, assert_same_state, twin

PARAMS = dict(min_swap_bytes=1, force_copy=True, swap_params=True)


def _pair(model: nn.Module, step, steps: int = 2, **kw):
    """`steps` training steps of a plain copy and of `model` inside outcore.swap: equal
    outputs, gradients and state, bit for bit; the mode stack left empty."""
    plain = twin(model)
    want = [step(plain) for _ in range(steps)]
    with outcore.swap(model, **(kw or PARAMS)) as s:
        got = [step(model) for _ in range(steps)]
    for a, b in zip(want, got):
        assert torch.equal(a, b), (a - b).abs().max()
    assert_same_grads(plain, model)
    assert_same_state(plain, model)
    assert torch._C._len_torch_function_stack() == 0
    return s


# ---- an eval-mode attention inside a training model --------------------------------------

class FrozenEncoder(nn.Module):
    """A frozen pretrained encoder (eval, no grad) under a trainable head: its inference
    fast path (taken only while no torch-function mode is active) runs in every plain step."""

    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.enc = (nn.MultiheadAttention(16, 4, batch_first=True) if kind == "mha" else
                    nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True))
        self.head = nn.Linear(16, 3)
        self.enc.requires_grad_(False)
        self.train()

    def train(self, mode: bool = True):
        super().train(mode)
        self.enc.eval()      # kept in eval while the head trains
        return self

    def forward(self, x):
        h = self.enc(x, x, x, need_weights=False)[0] if self.kind == "mha" else self.enc(x)
        return self.head(h)


@pytest.mark.parametrize("kind", ["mha", "encoder layer"])
def test_a_frozen_eval_attention_in_a_training_model_rounds_as_plain(kind):
    # The guard decided "inference" from the root's mode only: the root trains, so its
    # first forward ran guarded, which turned the eval attention's fast path off (other
    # rounding than plain and than every later, unguarded forward).
    x = torch.randn(2, 5, 16)

    def step(m):
        out = m(x)
        out.square().mean().backward()
        return out.detach()
    _pair(FrozenEncoder(kind), step)


# ---- reads of a swapped-out parameter's metadata only -------------------------------------

class MetaRead(nn.Module):
    """The parent looks at a child's weight for its dtype, device or shape only (no element
    is read: fine on freed storage)."""

    def __init__(self, how: str):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(20, 8)
        self.lin = nn.Linear(8, 8)
        self.how = how

    def forward(self, ids):
        h = self.lin(self.emb(ids))
        w = self.emb.weight
        if self.how == "type_as":
            return h.type_as(w)
        if self.how == "to":
            return h.to(w)
        if self.how == "zeros_like":
            return h + torch.zeros_like(w)[:, :1].sum()
        if self.how == "new_zeros":
            return h + w.new_zeros(8)
        if self.how == "expand_as":
            return h + torch.ones(1, 1).expand_as(w).sum()
        return h * len(w)


@pytest.mark.parametrize("how", ["type_as", "to", "zeros_like", "new_zeros", "expand_as",
                                 "len"])
def test_reading_only_a_swapped_out_parameters_metadata_is_allowed(how):
    ids = torch.randint(0, 20, (3, 5))

    def step(m):
        out = m(ids)
        out.square().mean().backward()
        return out.detach()
    _pair(MetaRead(how), step)


# ---- reads through an attribute that aliases the elements ---------------------------------

def _tied(read):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.lin = nn.Linear(16, 16)

        def forward(self, ids):
            return read(self, self.lin(self.emb(ids)))
    return Tied()


@pytest.mark.parametrize("attr,read", [
    ("T", lambda m, h: h @ m.emb.weight.T),         # the usual spelling of a tied head
    ("mT", lambda m, h: h @ m.emb.weight.mT),
    ("data", lambda m, h: h @ m.emb.weight.data.t()),
])
def test_a_read_through_T_or_data_is_refused_in_one_line(attr, read):
    # These went through as metadata (__get__) and failed deep in torch (setStorage: ...
    # out of bounds for storage of size 0) instead of the guard's one line.
    model = _tied(read)
    ids = torch.randint(0, 50, (3, 7))
    with outcore.swap(model, **PARAMS):
        with pytest.raises(OutcoreError) as e:
            model(ids)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"emb.weight was read by .{attr} outside the forward of emb" in msg
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize("read", [
    "self.b(self.a(x)) + self.a.weight.data.sum()",
    # MoCo's momentum update of the key encoder, inside forward under no_grad
    "self.b(self.a(x)) + self.ema()",
])
def test_an_elementwise_read_through_data_is_refused_not_a_segfault(read):
    # `.data` gives a new tensor on the same freed storage: the guard let it through and
    # the next op read freed memory (a segfault: run in a child process).
    code = textwrap.dedent("""
        import torch, outcore
        from torch import nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b, self.key = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
            @torch.no_grad()
            def ema(self):
                for q, k in zip(self.a.parameters(), self.key.parameters()):
                    k.data = k.data * 0.99 + q.data * 0.01
                return 0
            def forward(self, x):
                return READ
        m = M()
        with outcore.swap(m, min_swap_bytes=1, force_copy=True, swap_params=True):
            try:
                m(torch.randn(2, 8))
            except outcore.OutcoreError as e:
                print("refused:", e)
    """).replace("READ", read)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert " was read by .data outside the forward of " in r.stdout


def test_assigning_data_of_a_swapped_out_parameter_is_refused():
    # p.data = t outside p's module: the swap's next fetch of p copied its host copy into
    # t's storage, silently undoing the assignment (other outputs than plain PyTorch).
    class Reset(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            self.b.weight.data = torch.ones(4, 4)
            return self.b(self.a(x))

    model = Reset()
    with outcore.swap(model, **PARAMS):
        with pytest.raises(OutcoreError, match=r"b\.weight was read by \.data = outside the "
                                               r"forward of b,") as e:
            model(torch.randn(2, 4))
    assert "\n" not in str(e.value)
    assert torch._C._len_torch_function_stack() == 0


# ---- user hooks ---------------------------------------------------------------------------

def test_a_submodule_forward_hook_added_after_the_swap_may_read_its_weight():
    # Logging a module's weight norm from its forward hook: plain PyTorch runs it. The
    # swap's own forward hook ran first and freed the weight (refused when guarded, a
    # segfault on the unguarded forwards after).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 8))
    plain = twin(model)
    x = torch.randn(4, 16)
    logs = {"plain": [], "swap": []}

    def watch(m, key):
        for sub in (m[0], m[2]):
            sub.register_forward_hook(lambda mod, a, o: logs[key].append(mod.weight.norm()))

    def step(m):
        out = m(x)
        out.square().mean().backward()
        return out.detach()
    watch(plain, "plain")
    want = [step(plain) for _ in range(3)]
    with outcore.swap(model, **PARAMS):
        watch(model, "swap")
        got = [step(model) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert len(logs["swap"]) == 6
    assert all(torch.equal(a, b) for a, b in zip(logs["plain"], logs["swap"]))
    assert_same_grads(plain, model)


def test_a_root_forward_hook_added_after_the_swap_is_guarded():
    # A hook on the model itself (wandb.watch-like parameter logging) runs after the swap's
    # forward hook: the guard was already off, and its read of a child's swapped-out weight
    # read freed memory. Run in a child process (the unfixed read segfaults).
    code = textwrap.dedent("""
        import torch, outcore
        from torch import nn
        m = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        with outcore.swap(m, min_swap_bytes=1, force_copy=True, swap_params=True):
            m.register_forward_hook(lambda mod, a, o: print(mod[0].weight.norm().item()))
            try:
                m(torch.randn(2, 8))
            except outcore.OutcoreError as e:
                print("refused:", e)
            print("stack", torch._C._len_torch_function_stack())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "refused: outcore.swap(swap_params=True): 0.weight was read by norm" in r.stdout
    assert "stack 0" in r.stdout


# ---- the mode stack ---------------------------------------------------------------------

class Stop(BaseException):
    """What Ctrl-C raises inside forward: torch runs no always-call hook for it."""


class Counting(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_after_an_interrupted_forward_the_stale_guard_goes_not_the_users_mode():
    # The interrupted forward's guard stays pushed until the next forward drops it; that
    # forward ran inside the user's own mode, and popping "the top" took the user's mode
    # off instead (it saw nothing of the forward) and left the stale guard in its place.
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
            self.stop = False
            self.seen = []

        def forward(self, x):
            h = self.a(x)
            if self.stop:
                raise Stop
            self.seen.append([type(m).__name__ for m in _get_current_function_mode_stack()])
            return self.b(h)

    model, x = M(), torch.randn(2, 8)
    s = outcore.swap(model, **PARAMS)
    try:
        model.stop = True
        with pytest.raises(Stop):
            model(x)
        model.stop = False
        with Counting() as mode:
            model(x).sum().backward()
            assert [type(m) for m in _get_current_function_mode_stack()] == [Counting]
        assert model.seen == [["Counting"]]
        assert mode.ops > 0
        assert torch._C._len_torch_function_stack() == 0
    finally:
        s.close()
    assert torch._C._len_torch_function_stack() == 0


def test_an_outer_swap_closed_inside_an_inner_forward_leaves_the_inner_guard():
    # Two swapped models, B called from A's forward (not A's submodule); A's swap closed
    # inside B's forward popped the top of the stack: B's guard, not A's.
    class M(nn.Module):
        def __init__(self, inner=None, hook=None):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
            object.__setattr__(self, "inner", inner)
            self.hook = hook

        def forward(self, x):
            h = self.a(x)
            if self.inner is not None:
                h = h + self.inner(h)
            if self.hook is not None:
                self.hook()
            return self.b(h)

    inner = M()
    outer = M(inner=inner)
    sa, sb = outcore.swap(outer, **PARAMS), outcore.swap(inner, **PARAMS)
    left = []

    def close_outer():
        sa.close()
        left.extend(getattr(m, "swapper", None) for m in _get_current_function_mode_stack())
    inner.hook = close_outer
    outer(torch.randn(2, 8)).sum().backward()
    sb.close()
    assert left == [sb.params]
    assert torch._C._len_torch_function_stack() == 0


# ---- torch.compile made apart from the swapped model ---------------------------------------

@pytest.mark.parametrize("how", ["compiled wrapper", "compiled function"])
def test_a_model_run_by_compiled_code_made_apart_is_refused_in_one_line(how):
    # refuse_compiled looks at the model handed to outcore.swap; a torch.compile of it made
    # apart (or a compiled train step calling it) ran the swap's hooks inside dynamo: a
    # fake-tensor error deep in dynamo (aot_eager) or a segfault (inductor).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 8))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 16)
    if how == "compiled wrapper":
        run = torch.compile(model, backend="aot_eager")
    else:
        run = torch.compile(lambda x: model(x).square().mean(), backend="aot_eager")
    with outcore.swap(model, **PARAMS):
        with pytest.raises(OutcoreError, match="torch.compile'd code runs.*swap_params=False") as e:
            run(x)
        assert "\n" not in str(e.value)
        model(x).sum().backward()   # uncompiled, the same swap still works
    assert torch._C._len_torch_function_stack() == 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
