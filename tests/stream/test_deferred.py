"""Held updates made on the device by the next load of the block (held_gpu_updates): the
same training as plain PyTorch with clipping, on the CPU as the device."""

import copy

import pytest
import torch
from torch import nn

import outcore
from outcore.errors import OutcoreError

from .models import ListModel, batch_for, blocks_for, loss_fn_for, make
from .test_equivalence import EPS, LR, WD, assert_params_match, model_ref_batches, plain_steps
from .test_errors import _Poisoned


def _engine(model, family, **kw):
    return outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                          device="cpu", blocks=blocks_for(family), **kw)


@pytest.mark.parametrize("family", ["decoder", "gpt2"])
def test_deferred_updates_match_plain_pytorch_with_clipping(family):
    model, ref, batches = model_ref_batches(family)
    want = plain_steps(ref, batches, loss_fn_for(family), 0.05)
    engine = _engine(model, family, micro_batch_size=2, max_grad_norm=0.05,
                     held_gpu_updates=2)
    assert engine.deferred.groups == {1, 2}
    got = [engine.train_step(b, loss_fn=loss_fn_for(family)) for b in batches]
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-5 * abs(w), (got, want)
    # steps 2 and 3 loaded blocks 1 and 2 with step 1's and step 2's updates pending
    assert engine.deferred.applied_on_device == 4
    assert_params_match(engine, ref)              # engine.model flushes step 3's
    assert engine.deferred.applied_on_host == 2 and not engine.deferred.pending
    engine.close()


def test_reading_the_model_between_steps_changes_nothing():
    model, ref, batches = model_ref_batches("decoder")
    want = plain_steps(ref, batches, None, 0.05)
    engine = _engine(model, "decoder", max_grad_norm=0.05, held_gpu_updates=3)
    got = []
    for b in batches:
        got.append(engine.train_step(b))
        _ = engine.model                          # flushes what is pending, on the CPU
    assert got == pytest.approx(want, rel=1e-5)
    assert_params_match(engine, ref)
    engine.close()


def test_resume_with_deferred_updates_is_exact(tmp_path):
    torch.manual_seed(5)
    base = make("decoder")
    gen = torch.Generator().manual_seed(6)
    batches = [batch_for("decoder", gen) for _ in range(5)]
    kw = dict(device="cpu", max_grad_norm=1.0, held_gpu_updates=2)
    opt = outcore.AdamW(lr=2e-3, eps=1e-6, weight_decay=0.05)
    a = outcore.Engine(copy.deepcopy(base), optimizer=opt, **kw)
    for x in batches[:2]:
        a.train_step(x)
    a.save(tmp_path / "ck")                       # flushes the pending updates first
    want = [a.train_step(x) for x in batches[2:]]
    c = outcore.Engine.load(tmp_path / "ck", make("decoder"), **kw)
    got = [c.train_step(x) for x in batches[2:]]
    assert got == want
    for (n, p), (_, q) in zip(a.model.named_parameters(), c.model.named_parameters()):
        assert torch.equal(p, q), n
    a.close()
    c.close()


class _Switchable(_Poisoned):
    """_Poisoned (an inf gradient for its parameter) while `on`, else a plain identity."""

    on = False

    def forward(self, x):
        return super().forward(x) if self.on else x + 0.0 * self.p.sum()


def test_a_skipped_step_leaves_deferred_blocks_untouched():
    torch.manual_seed(0)
    poison = _Switchable()
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3), poison)
    eng = outcore.Engine(model, device="cpu", skip_nonfinite=True, held_gpu_updates=3)
    batch = {"input": torch.randn(4, 8), "y": torch.randint(0, 3, (4,))}
    loss = lambda o, b: nn.functional.cross_entropy(o, b["y"])  # noqa: E731
    eng.train_step(batch, loss_fn=loss)              # a good step: its updates pending
    after_good = [p.detach().clone() for p in eng.model.parameters()]
    poison.on = True
    eng.train_step(batch, loss_fn=loss)              # inf gradient: the whole step skipped
    assert eng.last_step_skipped
    assert not eng.deferred.pending and not eng.deferred._held
    for p, q in zip(eng.model.parameters(), after_good):
        assert torch.equal(p, q)
    poison.on = False
    eng.train_step(batch, loss_fn=loss)              # training goes on
    assert any(not torch.equal(p, q) for p, q in zip(eng.model.parameters(), after_good))
    eng.close()


def test_option_errors():
    model = make("decoder")
    with pytest.raises(OutcoreError, match="needs held updates"):
        outcore.Engine(model, device="cpu", held_gpu_updates=2)
    with pytest.raises(OutcoreError, match="held_gpu_updates="):
        outcore.Engine(model, device="cpu", max_grad_norm=1.0, held_gpu_updates="all")
    eng = outcore.Engine(model, device="cpu", max_grad_norm=1.0, held_gpu_updates="auto")
    assert eng.held_gpu_updates == 0               # 'auto' is for CUDA only
    eng.close()


class _Ev:
    """A fake CUDA event: the recording stream's vector clock when it was recorded."""

    def __init__(self, clock):
        self.clock = dict(clock)

    def synchronize(self):
        pass

    def query(self):
        return True


class _StreamOrder:
    """On the CPU (where every copy is synchronous), the happens-before order the engine
    sets up between its streams, kept as vector clocks through Lanes.event / Lanes.wait."""

    def __init__(self, lanes):
        self.clock = {s: {s: 0} for s in ("compute", "h2d", "d2h")}
        lanes.compute, lanes.h2d, lanes.d2h = "compute", "h2d", "d2h"
        lanes.event, lanes.wait = self.event, self.wait

    def event(self, stream=None):
        c = self.clock[stream or "compute"]
        c[stream or "compute"] += 1
        return _Ev(c)

    def wait(self, stream, ev):
        if ev is not None:
            c = self.clock[stream]
            for k, v in ev.clock.items():
                c[k] = max(c.get(k, 0), v)

    def after(self, stream, ev) -> bool:
        """Work enqueued on `stream` now runs after `ev`."""
        return ev is None or all(self.clock[stream].get(k, 0) >= v for k, v in ev.clock.items())


def test_a_slot_is_refilled_only_after_the_write_back_of_its_update():
    """4 blocks, 3 slots, block 1 updated by its load: block 4's load reuses block 1's slot,
    and must wait for the d2h copy of the updated weights out of it (the compute stream's
    release of the slot does not cover it); every load of a master waits for its write-back."""
    torch.manual_seed(0)
    eng = outcore.Engine(ListModel(), device="cpu", blocks="trunk", max_grad_norm=1.0,
                         held_gpu_updates=1)
    order = _StreamOrder(eng.lanes)
    read_back: dict[int, object] = {}   # slot address -> event of the last d2h read of it
    reused = []
    fill = eng.cache.fill

    def checked_fill(g, dst, master):
        ptr = dst.data_ptr()
        assert order.after("h2d", eng.host_ready.get(g)), f"block {g}: master still written"
        assert order.after("h2d", read_back.get(ptr)), f"block {g}: slot still read back"
        if ptr in read_back:
            reused.append(g)
        n = eng.deferred.applied_on_device
        ev = fill(g, dst, master)
        if eng.deferred.applied_on_device > n:
            read_back[ptr] = eng.host_ready[g]
        return ev

    eng.cache.fill = checked_fill
    batch = {"x": torch.randn(4, 8), "y": torch.randint(0, 3, (4,))}
    loss = lambda o, b: nn.functional.cross_entropy(o, b["y"])  # noqa: E731
    for _ in range(3):
        eng.train_step(batch, loss_fn=loss)
    assert eng.deferred.applied_on_device == 2 and 4 in reused
    eng.close()


class _Skipping(ListModel):
    """ListModel whose forward leaves out the blocks in `skip` (layer drop)."""

    skip: set = set()

    def forward(self, x):
        h = self.inp(x)
        for i, blk in enumerate(self.trunk):
            if i not in self.skip:
                h = h + blk(h)
        return self.out(h)


def _skipping_setup(**engine_kw):
    """(model, its copy, batch, loss, engine, plain AdamW) for the layer-drop tests."""
    torch.manual_seed(0)
    model = _Skipping()
    ref = copy.deepcopy(model)
    batch = {"x": torch.randn(4, 8), "y": torch.randint(0, 3, (4,))}
    loss = lambda o, b: nn.functional.cross_entropy(o, b["y"])  # noqa: E731
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=1e-2, eps=EPS, weight_decay=WD),
                         device="cpu", blocks="trunk", **engine_kw)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=EPS, weight_decay=WD)
    return model, ref, batch, loss, eng, opt


def test_a_pending_update_keeps_the_learning_rate_of_its_step():
    """Blocks 1 and 2 left out of step 2's forward: block 2's pending update (step 1's) is
    made by step 2's backward prefetch, after set_lr bound step 2's rate; it must still use
    step 1's rate, as plain PyTorch does."""
    model, ref, batch, loss, eng, opt = _skipping_setup(skip_nonfinite=True,
                                                        held_gpu_updates=2)
    for step, lr in enumerate([1e-2, 1e-1]):
        model.skip = ref.skip = {0, 1} if step else set()
        eng.set_lr(lr)
        eng.train_step(batch, loss_fn=loss)
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.zero_grad()
        loss(ref(batch["x"]), batch).backward()
        opt.step()
    assert eng.deferred.applied_on_device == 2
    ours = dict(eng.model.named_parameters())
    for name, p in ref.named_parameters():
        assert torch.allclose(ours[name], p, rtol=1e-5, atol=1e-7), name
    eng.close()


def test_the_first_stash_limit_leaves_room_for_the_chunk_ring():
    kw = dict(device="cpu", blocks="trunk", max_grad_norm=1.0, gpu_memory="64MiB")
    plain = outcore.Engine(ListModel(), **kw)
    held = outcore.Engine(ListModel(), held_gpu_updates=2, **kw)
    assert held.deferred.bytes() > 0
    assert plain._stash_limit() - held._stash_limit() >= held.deferred.bytes() // 2
    plain.close()
    held.close()


def test_a_block_run_without_its_predecessor_waits_for_its_own_update():
    """Layer drop: when block 1 is left out, nothing prefetched block 2, and its forward
    must still wait for block 2's CPU update of the last step (a slow worker here)."""
    import time
    model, ref, batch, loss, eng, opt = _skipping_setup()
    step = eng.opt.step

    def slow_step(g, *a, **kw):
        if g == 2:
            time.sleep(0.3)           # the update the next forward must wait for
        step(g, *a, **kw)
    eng.opt.step = slow_step
    for skip in (set(), {0}):
        model.skip = ref.skip = skip
        got = eng.train_step(batch, loss_fn=loss)
        opt.zero_grad()
        want = loss(ref(batch["x"]), batch)
        want.backward()
        opt.step()
        assert got == pytest.approx(want.item(), rel=1e-5)
    eng.close()
