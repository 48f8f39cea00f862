"""Engine(block_slots=N): more device slots, so the runner loads N - 2 blocks ahead of
the one computing (and a device-updated block's m, v with them). Opt-in: training must
equal plain PyTorch, with the ring of m, v buffers large enough for the deeper prefetch."""

import copy

import pytest
import torch

import outcore
from outcore.errors import OutcoreError
from outcore.models import decoder

from .models import batch_for
from .test_equivalence import EPS, LR, WD, assert_params_match, plain_steps


def setup(layers: int = 8, steps: int = 4):
    torch.manual_seed(1)
    model = decoder("tiny", vocab=96, max_seq=64, layers=layers)
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(2)
    return model, ref, [batch_for("decoder", gen) for _ in range(steps)]


@pytest.mark.parametrize("slots,gpu_updates", [(4, 0), (5, 0), (4, 3), (5, 5)])
def test_more_slots_train_like_plain_pytorch(slots, gpu_updates):
    model, ref, batches = setup()
    want = plain_steps(ref, batches, None, None)
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                         device="cpu", gpu_updates=gpu_updates, block_slots=slots)
    ahead, backward_ahead = [], []
    real_ahead, real_back = eng.prefetch_ahead, eng.prefetch_backward
    eng.prefetch_ahead = lambda g: (ahead.append(g), real_ahead(g))
    eng.prefetch_backward = lambda g: (backward_ahead.append(g), real_back(g))
    got = [eng.train_step(b) for b in batches]
    assert got == pytest.approx(want, rel=1e-5)
    assert_params_match(eng, ref)
    assert len(eng.cache.slots) == slots and eng.runner.prefetch_depth == slots - 2
    # the forward asked for blocks 2 .. slots - 2 ahead of block 1 on (past the last
    # block: nothing), the backward for block 1 from each of the slots - 2 blocks after it
    n = len(eng.groups)
    assert min(ahead) == 3 and max(ahead) == n - 1 + slots - 2
    assert sorted(set(ahead)) == list(range(3, n - 1 + slots - 1))
    assert backward_ahead.count(1) == len(batches) * (slots - 2)
    if gpu_updates:
        assert len(eng.updater._ring.bufs) == slots - 1
    eng.close()


def test_the_default_is_three_slots_and_one_block_ahead():
    model, _, batches = setup(layers=4, steps=1)
    eng = outcore.Engine(model, device="cpu", gpu_updates=0)
    eng.prefetch_ahead = lambda g: pytest.fail("the default loads one block ahead only")
    eng.train_step(batches[0])
    assert len(eng.cache.slots) == 3 and eng.runner.prefetch_depth == 1
    eng.close()


@pytest.mark.parametrize("bad", [2, 9, True, 3.0, "4"])
def test_a_bad_slot_count_is_one_line(bad):
    model, _, _ = setup(layers=2, steps=1)
    with pytest.raises(OutcoreError, match=r"block_slots=.*: use an int from 3"):
        outcore.Engine(model, device="cpu", block_slots=bad)


def test_distributed_training_keeps_three_slots():
    """The sharded engine's loads all-gather on the compute stream in one order on every
    rank; its cache refuses more slots in one line instead of reordering them."""
    from types import SimpleNamespace

    from outcore.parallel.engine import ShardedEngine
    with pytest.raises(OutcoreError, match="block_slots=4 is for one process"):
        ShardedEngine._device_cache(SimpleNamespace(block_slots=4))
