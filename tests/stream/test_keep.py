"""Engine(keep_weights=True): device-updated blocks past the slots keep a compute-dtype copy
on the device for the next forward (keep.py). Training is bit-for-bit the same as without;
the forward loads fewer bytes; the copies fit the room they are given and never outlive a
change of the host weights."""

import copy

import pytest
import torch

import outcore
from outcore.errors import OutcoreError
from outcore.models import decoder
from outcore.stream.balance import traffic
from outcore.stream.stash import ActivationStash
from outcore.memory import PinnedPool
from outcore.transfer import Lanes

LAYERS = 9          # blocks 1..9; with 3 slots, device blocks 4..6 can be kept
DEVICE = [0, 1, 2, 3, 4, 5, 6]


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (4, 32), generator=g)
    return {"input_ids": x, "labels": x}


@pytest.fixture
def model():
    torch.manual_seed(0)
    return decoder("tiny", layers=LAYERS)


def engine(model, keep, dtype=torch.bfloat16, groups=DEVICE, **kw):
    eng = outcore.Engine(copy.deepcopy(model), optimizer=outcore.AdamW(lr=1e-2),
                         device="cpu", compute_dtype=dtype, keep_weights=keep,
                         gpu_updates=0, **kw)
    eng.updater.enable(list(groups))
    return eng


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("micro", [None, 1])
def test_same_training_fewer_forward_loads(model, dtype, micro):
    plain = engine(model, False, dtype, micro_batch_size=micro)
    kept = engine(model, True, dtype, micro_batch_size=micro)
    steps = 3
    for s in range(steps):
        assert kept.train_step(batch(s)) == plain.train_step(batch(s))
        if s:   # step 1 has nothing kept yet; later forwards take blocks 4, 5, 6
            assert kept.stats.kept_blocks == 3
    for (n, a), b in zip(plain.model.named_parameters(), kept.model.parameters()):
        assert torch.equal(a, b), n
    saved = 4 * sum(kept.groups[g].numel for g in (4, 5, 6)) * (steps - 1)
    assert plain.cache.bytes_h2d - kept.cache.bytes_h2d == saved
    assert plain.stats.kept_blocks == 0


def test_only_what_the_room_holds_is_kept_highest_first(model):
    eng = engine(model, True)
    block = eng.groups[4].numel * 2            # bf16 bytes of one block
    # room for the checkpoints held at the time and one and a half blocks
    eng.keep.room = lambda: eng.stash.device_bytes + block + block // 2
    eng.train_step(batch(0))
    assert sorted(eng.keep._kept) == [6]       # backward updates 6 first; 5 did not fit
    assert eng.keep.bytes == block
    eng.train_step(batch(1))
    assert eng.stats.kept_blocks == 1
    eng.keep.room = lambda: -1                  # a budget, nothing measured: none kept
    eng.train_step(batch(2))
    assert eng.keep.bytes == 0 and not eng.keep._kept


def test_kept_copies_share_the_checkpoints_room(model):
    eng = engine(model, True)
    eng.keep.room = lambda: 10**9
    eng.train_step(batch(0))
    assert eng.stash.held_bytes() == eng.keep.bytes > 0
    stash = ActivationStash(Lanes(torch.device("cpu")), PinnedPool(pin=False))
    stash.limit, stash.beside = 600, (lambda: 500)
    x = torch.zeros(50)                         # 200 bytes: 700 > 600, to the host
    stash.put(1, x)
    assert stash.device_bytes == 0 and stash.bytes_offloaded == 200
    assert torch.equal(stash.take(1), x)


def test_edits_through_model_drop_the_copies(model):
    eng = engine(model, True)
    eng.train_step(batch(0))
    assert eng.keep._kept
    with torch.no_grad():
        for p in eng.model.layers[5].parameters():
            p.mul_(0.5)
    fresh = engine(copy.deepcopy(eng.model), False)
    assert eng.train_step(batch(1)) == fresh.train_step(batch(1))
    assert eng.stats.kept_blocks == 0


def test_cpu_updated_blocks_and_blocks_in_slots_are_not_kept(model):
    eng = engine(model, True, groups=[0, 1, 2, 5])
    eng.train_step(batch(0))
    assert sorted(eng.keep._kept) == [5]
    eng.train_step(batch(1))
    assert eng.stats.kept_blocks == 1


def test_prefetch_looks_past_kept_blocks_unless_the_next_update_is_pending(model):
    eng = engine(model, True, groups=[0, 1, 2, 3, 4, 5, 6])
    eng.train_step(batch(0))
    eng.schedule.wait_all()
    assert not eng.cache.holds(7, torch.float32)
    real = eng.schedule.pending
    eng.schedule.pending = lambda g: True
    eng.prefetch_forward(4)                     # 4..6 kept; 7's update "still running"
    assert not eng.cache.holds(7, torch.float32)
    eng.schedule.pending = real
    eng.prefetch_forward(4)
    assert eng.cache.holds(7, torch.float32)


def test_the_last_blocks_of_forward_are_not_kept(model):
    eng = engine(decoder("tiny", layers=7), True)   # blocks 5..7 stay in slots for backward
    assert [g for g in range(8) if eng.keep.keepable(g)] == [4]
    eng.train_step(batch(0))
    assert sorted(eng.keep._kept) == [4]


def test_traffic_counts_kept_blocks_as_no_forward_load():
    numels = [10] + [100] * 8
    device = {0, 1, 2, 3, 4, 5}
    h0, d0, c0 = traffic(numels, device, None, 3)
    h1, d1, c1 = traffic(numels, device, None, 3, kept=1)
    h5, _, _ = traffic(numels, device, None, 3, kept=5)
    assert h0 - h1 == 4 * 100                   # block 5's forward load
    assert h0 - h5 == 2 * 4 * 100               # only blocks 4, 5 are past the slots
    assert (d0, c0) == (d1, c1)


def test_keep_weights_must_be_a_bool(model):
    with pytest.raises(OutcoreError, match="keep_weights"):
        outcore.Engine(copy.deepcopy(model), device="cpu", keep_weights="yes")
