"""It really streams: only the blocks in flight are on the device; offload is exact."""

import copy
import time

import pytest
import torch

import outcore

from .models import batch_for, make


def test_at_most_three_blocks_resident():
    model = outcore.models.decoder("tiny", layers=8, vocab=96, max_seq=64)
    eng = outcore.Engine(model, device="cpu", micro_batch_size=2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        eng.train_step(batch_for("decoder", gen))
    block = max(g.numel for g in eng.groups[1:])
    assert 1 <= eng.stats.max_blocks_in_flight <= 3
    # The device holds 3 block-sized slots and the resident group, never the whole model.
    assert eng.cache.bytes() == 3 * block * 4 + eng.groups[0].numel * 4
    assert eng.cache.bytes() < eng.num_params * 4
    # The engine reports its device bytes: slots, gradient ring and checkpoints.
    assert eng.cache.bytes() < eng.stats.peak_device_bytes < eng.num_params * 4 * 2
    # Each step copies every block in twice at most (forward, backward; the last is reused).
    n_blocks = len(eng.groups) - 1
    assert eng.stats.bytes_h2d <= 2 * (2 * n_blocks * block * 4 + eng.groups[0].numel * 4)
    eng.close()


def test_host_bytes_per_param():
    eng = outcore.Engine(make("decoder"), device="cpu", max_grad_norm=None)
    eng.train_step(batch_for("decoder", torch.Generator().manual_seed(0)))
    largest = max(g.numel for g in eng.groups)
    # 12 B/param (master, m, v) + gradient landing buffers of O(largest group).
    extra = eng.host_bytes_per_param() - 12.0
    assert 0 <= extra * eng.num_params <= 4 * 4 * largest + 64
    eng.close()


def test_checkpoint_offload_is_exact():
    """A tiny device budget pushes activation checkpoints to the host: same numbers."""
    torch.manual_seed(0)
    m1 = make("decoder")
    m2 = copy.deepcopy(m1)
    gen = torch.Generator().manual_seed(1)
    batches = [batch_for("decoder", gen) for _ in range(2)]
    from outcore.stream.plan import fixed_device_bytes
    a = outcore.Engine(m1, device="cpu")
    # Just above what the blocks in flight need: no room left for checkpoints.
    b = outcore.Engine(m2, device="cpu", gpu_memory=int(fixed_device_bytes(a) * 1.15))
    la = [a.train_step(x) for x in batches]
    lb = [b.train_step(x) for x in batches]
    assert b.stash.bytes_offloaded > 0 and a.stash.bytes_offloaded == 0
    assert la == lb
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    a.close()
    b.close()


def test_model_params_are_the_masters():
    eng = outcore.Engine(make("decoder"), device="cpu")
    before = [p.detach().clone() for p in eng.model.parameters()]
    eng.train_step(batch_for("decoder", torch.Generator().manual_seed(0)))
    after = list(eng.model.parameters())
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    eng.close()


def test_batch_major_weights_cross_once_per_pass_whatever_the_micro_batches():
    """Every micro-batch goes through block i before block i+1 is loaded: the bytes copied
    to the device per step do not grow with the number of micro-batches."""
    def h2d_bytes(micro):
        torch.manual_seed(0)
        model = outcore.models.decoder("tiny", layers=6, vocab=96, max_seq=64)
        eng = outcore.Engine(model, device="cpu", micro_batch_size=micro)
        gen = torch.Generator().manual_seed(0)
        b = batch_for("decoder", gen, rows=6)
        eng.train_step(b)
        before = eng.cache.bytes_h2d
        eng.train_step(b)
        n = eng.cache.bytes_h2d - before
        eng.close()
        return n, eng
    whole, eng = h2d_bytes(None)
    per_row, _ = h2d_bytes(1)
    assert whole == per_row
    block = max(g.numel for g in eng.groups[1:]) * 4
    n_blocks = len(eng.groups) - 1
    # forward loads every block once; backward reloads at most those evicted since
    assert n_blocks * block <= whole <= 2 * n_blocks * block + eng.groups[0].numel * 4


def test_device_update_planner_moves_the_end_of_backward_first():
    """The feedback planner moves work only when the step waited for the CPU, and takes
    groups from the end of backward (rest, block 1, 2, ...)."""
    eng = outcore.Engine(outcore.models.decoder("tiny", layers=6, vocab=96, max_seq=64),
                         device="cpu")
    up = eng.updater
    assert up.plan(step_s=1.0, opt_wait_s=0.01, cpu_busy_s=0.5, cpu_params=10**6) == []
    # Waited 0.2 s at 1e6 params/s: a backlog of 2e5 params, about this many blocks.
    added = up.plan(step_s=1.0, opt_wait_s=0.2, cpu_busy_s=1.0, cpu_params=10**6)
    assert added[:2] == [0, 1] and added == list(range(len(added)))
    moved = sum(eng.groups[g].numel for g in added)
    assert moved > 2e5 and moved - eng.groups[added[-1]].numel <= 2e5 or len(added) == 2
    again = up.plan(step_s=1.0, opt_wait_s=0.2, cpu_busy_s=1.0, cpu_params=10**6)
    assert again and again[0] == len(added)  # never moves a group twice
    eng.close()


def test_device_update_planner_keeps_the_budget():
    """Moved groups' device state must fit beside the last step's measured peak: rest's
    m, v (8 B/param) is skipped when it does not fit, blocks still move once the ring of
    two blocks' m|v fits, and nothing moves when neither does."""
    def engine():
        return outcore.Engine(outcore.models.decoder("tiny", layers=6, vocab=2048,
                                                     max_seq=64), device="cpu")
    eng = engine()
    up = eng.updater
    rest = 8 * eng.groups[0].numel
    ring = 16 * eng.cache.slots[0].buf.numel()
    assert rest > ring   # embeddings and head of a 2048-token vocabulary outweigh a block
    # A backlog of 5e4 params: rest and block 1 without the budget (two groups at least).
    wait = dict(step_s=1.0, opt_wait_s=0.05, cpu_busy_s=1.0, cpu_params=10**6)
    eng.gpu_memory = 10**9
    eng._other_peak = eng._usable_device_bytes() - ring   # room for the ring, not rest
    assert up.plan(**wait) == [1]
    assert eng._device_room() == 0   # enable() counted the ring: no room is left for rest
    assert up.plan(**wait) == [2] and up.groups == {1, 2}
    eng.close()
    fresh = engine()
    fresh.gpu_memory = 10**9
    fresh._other_peak = fresh._usable_device_bytes() - ring + 1
    assert fresh.updater.plan(**wait) == []
    fresh._other_peak = None   # no measured step (or no budget): the backlog alone decides
    assert fresh.updater.plan(**wait)[0] == 0
    fresh.close()


def test_staged_gradients_are_capped_and_training_is_unchanged():
    """At most max_staged_grads gradients wait in (pinned) host memory for the CPU AdamW:
    the pool keeps every buffer it ever allocated, so an early backlog stayed for the run
    (~3.8 B/param at 3b-16k on the H200). The cap changes when backward waits, not what
    it computes."""
    gen = torch.Generator().manual_seed(0)
    b = batch_for("decoder", gen, rows=4)
    runs = []
    for cap in (None, 2):
        torch.manual_seed(0)
        eng = outcore.Engine(outcore.models.decoder("tiny", layers=8, vocab=96, max_seq=64),
                             device="cpu")
        eng.max_staged_grads = cap
        step = eng.opt.step

        def slow(*args, **kw):   # a CPU AdamW that falls behind backward
            time.sleep(0.02)
            step(*args, **kw)
        eng.opt.step = slow
        runs.append([eng.train_step(b) for _ in range(3)])
        eng.synchronize()   # every buffer back in the pool: count the block-sized ones
        block, pool = max(g.numel for g in eng.groups[1:]), eng.host.grad_pool
        staged = len(pool._free[(block, torch.float32)]) + sum(
            1 for _, t in pool._pending if t.numel() == block)
        assert staged <= cap if cap else staged > 2
        eng.close()
    assert runs[0] == runs[1]


def test_the_staging_cap_follows_the_hosts_room(monkeypatch):
    """Engine.max_staged_grads by default: no cap where every block's gradient fits in
    host memory beside the rest (with validate.AUTO_COPY_MARGIN to spare), else the most
    blocks that fit, never fewer than STAGED_GRADS; STAGED_GRADS where the host's free
    memory is unknown or updates are held (they keep every gradient anyway)."""
    from outcore import planner
    from outcore.stream.engine import STAGED_GRADS
    from outcore.stream.validate import AUTO_COPY_MARGIN
    model = outcore.models.decoder("tiny", layers=16, vocab=96, max_seq=64)
    n = sum(p.numel() for p in model.parameters())

    def engine(available, **kw):
        monkeypatch.setattr(planner, "host_available", lambda: available)
        eng = outcore.Engine(model, device="cpu", **kw)
        eng.close()
        blocks = [g.numel for g in eng.groups[1:]]
        return eng.max_staged_grads, max(blocks), len(blocks)

    base = (8 + AUTO_COPY_MARGIN) * n   # m, v and the margin: room for no gradient yet
    cap, block, blocks = engine(2**40)
    assert cap is None and blocks > STAGED_GRADS + 2
    assert engine(base + 4 * block * blocks)[0] is None
    assert engine(base + 4 * block * blocks - 1)[0] == blocks - 1
    assert engine(base + 4 * block * (STAGED_GRADS + 1))[0] == STAGED_GRADS + 1
    assert engine(base)[0] == STAGED_GRADS                   # the floor
    assert engine(None)[0] == STAGED_GRADS                   # free memory unknown
    assert engine(2**40, max_grad_norm=1.0)[0] == STAGED_GRADS
    # a sharded engine's rank keeps the floor: each rank weighs its share against the
    # whole host's free memory
    from outcore.stream.blocks import build_groups, find_blocks
    from outcore.stream.validate import resolve_staged_cap
    path, container = find_blocks(model, None)
    groups = build_groups(model, path, container)
    monkeypatch.setattr(planner, "host_available", lambda: 2**40)   # room for every block's
    assert resolve_staged_cap(groups, False, False, STAGED_GRADS) is None
    assert resolve_staged_cap(groups, False, False, STAGED_GRADS, shards=2) == STAGED_GRADS


def test_an_engine_the_host_cannot_hold_is_refused_in_one_line(monkeypatch):
    from outcore import planner
    model = outcore.models.decoder("tiny", layers=2, vocab=96, max_seq=64)
    n = sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(planner, "host_available", lambda: 8 * n - 1)   # not even m, v
    with pytest.raises(outcore.OutcoreError, match=r"needs .* more host memory for "
                       r"0\.00B params \(AdamW m, v 8 B/param\) but .* is available"):
        outcore.Engine(model, device="cpu")
    monkeypatch.setattr(planner, "host_available", lambda: 20 * n)
    outcore.Engine(model, device="cpu").close()


def test_the_printed_plan_says_how_many_gradients_may_wait(monkeypatch):
    from outcore import planner
    from outcore.stream.plan import describe
    model = outcore.models.decoder("tiny", layers=12, vocab=96, max_seq=64)
    monkeypatch.setattr(planner, "host_available", lambda: 2**40)
    eng = outcore.Engine(model, device="cpu")
    assert "up to 12 blocks' gradients" in describe(eng) and "the host has room" in describe(eng)
    eng.max_staged_grads = 8
    assert "up to 8 blocks' gradients" in describe(eng) and "has room" not in describe(eng)
    eng.close()
    held = outcore.Engine(model, device="cpu", max_grad_norm=1.0)
    assert "wait for the CPU AdamW" not in describe(held)
    held.close()
