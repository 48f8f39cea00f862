"""Engine(host_weight_copy=True): a 16-bit copy of each block's weights on the host, loaded
by every pass that needs no fp32 weights. The casts match the device's (round to nearest
even), so training is bit-for-bit the same as without the copies, with half the weight
bytes loaded; edits through engine.model and checkpoints keep the copies current."""

import copy

import pytest
import torch

import outcore
from outcore.errors import OutcoreError
from outcore.models import decoder

BF16 = torch.bfloat16


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (4, 32), generator=g)
    return {"input_ids": x, "labels": x}


def engine(model, copies, device_groups=(), **kw):
    eng = outcore.Engine(copy.deepcopy(model), optimizer=outcore.AdamW(lr=1e-2),
                         device="cpu", compute_dtype=BF16, host_weight_copy=copies, **kw)
    eng.updater.enable(list(device_groups))
    return eng


@pytest.fixture
def model():
    torch.manual_seed(0)
    return decoder("tiny")


@pytest.mark.parametrize("micro", [None, 1])
@pytest.mark.parametrize("device_groups", [(), (0, 2)])
def test_same_training_half_the_weight_bytes(model, device_groups, micro):
    plain = engine(model, False, device_groups, micro_batch_size=micro)
    kept = engine(model, True, device_groups, micro_batch_size=micro)
    for s in range(3):
        assert kept.train_step(batch(s)) == plain.train_step(batch(s))
    for (n, a), b in zip(plain.model.named_parameters(), kept.model.parameters()):
        assert torch.equal(a, b), n
    if not device_groups:   # every block pass loads the 16-bit copy; rest stays fp32,
        rest = 3 * plain.groups[0].numel * 4   # reloaded once a step after its CPU update
        assert 2 * kept.cache.bytes_h2d - plain.cache.bytes_h2d == rest
    else:                   # but a device-updated block's backward loads fp32
        assert plain.cache.bytes_h2d / 2 < kept.cache.bytes_h2d < plain.cache.bytes_h2d
    assert kept.host_bytes_per_param() > plain.host_bytes_per_param()


@pytest.mark.parametrize("copies", [False, True])
@pytest.mark.parametrize("device_groups", [(), (0, 2)])
def test_edits_through_model_are_trained_on(model, copies, device_groups):
    """Weights edited through engine.model (a block's and the resident embedding's) are
    what the next step trains: its loss is a fresh engine's on the edited model (rest
    updated on the device stays resident: it too is reloaded)."""
    eng = engine(model, copies, device_groups)
    eng.train_step(batch())
    with torch.no_grad():
        eng.model.layers[1].w1.weight.mul_(-1.0)
        eng.model.embed.weight.add_(0.5)
    edited = copy.deepcopy(eng.model)
    fresh = engine(edited, copies, device_groups)
    assert eng.train_step(batch(2)) == fresh.train_step(batch(2))


def test_checkpoint_round_trip_refreshes_the_copies(model, tmp_path):
    a = engine(model, True)
    a.train_step(batch(0))
    a.save(tmp_path / "ck")
    want = a.train_step(batch(1))
    b = outcore.Engine.load(tmp_path / "ck", copy.deepcopy(model), device="cpu",
                            compute_dtype=BF16, host_weight_copy=True)
    assert b.train_step(batch(1)) == want


def test_bad_combinations_are_one_line_errors(model):
    with pytest.raises(OutcoreError, match="16-bit compute dtype"):
        outcore.Engine(copy.deepcopy(model), device="cpu", host_weight_copy=True)
    with pytest.raises(OutcoreError, match="held_gpu_updates"):
        outcore.Engine(copy.deepcopy(model), device="cpu", compute_dtype=BF16,
                       max_grad_norm=1.0, held_gpu_updates=2, host_weight_copy=True)


def test_more_blocks_than_slots_with_staged_device_groups():
    """Session 6's failing GPU run in miniature: 8 blocks through 3 slots, groups moved to
    the device in three stages as the planner moves them, 12 steps on one batch. On the
    CPU the copies train bit-for-bit as without (the GPU run's jump back to the initial
    loss needs the device's asynchrony: see test_gpu.py)."""
    torch.manual_seed(0)
    m = decoder("tiny", layers=8)
    stages = {1: [0, 1, 2, 3], 2: [4, 5], 3: [6, 7]}
    runs = []
    for copies in (False, True):
        eng = outcore.Engine(copy.deepcopy(m), optimizer=outcore.AdamW(lr=1e-3),
                             device="cpu", compute_dtype=BF16, host_weight_copy=copies)
        assert len(eng.cache.slots) < len(eng.groups) - 1
        losses = []
        for s in range(12):
            eng.updater.enable(stages.get(s, []))
            losses.append(eng.train_step(batch(1)))
        if copies:
            for g in range(1, len(eng.groups)):
                assert torch.equal(eng.host.copy[g], eng.host.master[g].to(BF16)), g
        runs.append(losses)
        eng.close()
    assert runs[0] == runs[1]
    assert runs[0][-1] < runs[0][0]


def test_device_mode_copies_only_the_device_updated_blocks(model):
    """host_weight_copy="device": the device-updated blocks' passes that need no fp32 load
    their copy (the device writes it with each update), the CPU-updated blocks load fp32
    and the CPU AdamW casts nothing. Training is bit-for-bit the same as without copies,
    also for a block whose AdamW moves to the device mid-run."""
    torch.manual_seed(0)
    model = decoder("tiny", layers=8)   # more blocks than slots: 5, 6 are evicted between
    plain = engine(model, False, (0, 5, 6))   # their update and the next forward
    kept = engine(model, "device", (0, 5, 6))
    assert kept.copy_mode == "device"
    for s in range(4):
        if s == 2:
            for eng in (plain, kept):
                eng.updater.enable([7])        # moved by the planner between steps
        assert kept.train_step(batch(s)) == plain.train_step(batch(s))
    for (n, a), b in zip(plain.model.named_parameters(), kept.model.parameters()):
        assert torch.equal(a, b), n
    kept.synchronize()
    for g in range(1, len(kept.groups)):
        current = torch.equal(kept.host.copy[g], kept.host.master[g].to(BF16))
        assert current == (g in kept.updater.groups), g   # CPU blocks' copies go stale
    assert plain.cache.bytes_h2d / 2 < kept.cache.bytes_h2d < plain.cache.bytes_h2d


def test_a_copy_mode_that_does_not_exist_is_one_line(model):
    with pytest.raises(OutcoreError, match="host_weight_copy='some'"):
        engine(model, "some")


def model_numel(model, g: int) -> int:
    """Parameters of block g (1-based: group g of the engine) of a reference decoder."""
    return sum(p.numel() for p in model.layers[g - 1].parameters())


@pytest.mark.parametrize("keep", [False, True])
def test_lazy_copies_train_the_same_and_send_fewer_bytes(keep):
    """DeviceUpdater.lazy_copies: a device update sends no 16-bit copy back when the next
    forward finds the block on the device (block 2 in its slot; block 5 kept, with
    keep_weights), and a forward that meets a stale copy loads the fp32 master. Bit for bit
    the same training as with every copy sent, also for a group whose AdamW moves back to
    the CPU (whose update makes its copy current again); every copy not marked stale is
    current."""
    torch.manual_seed(0)
    model = decoder("tiny", layers=8)   # more blocks than slots: 5, 6 are evicted between
    runs = []
    for lazy in (False, True):
        eng = outcore.Engine(copy.deepcopy(model), optimizer=outcore.AdamW(lr=1e-2),
                             device="cpu", compute_dtype=BF16, host_weight_copy=True,
                             keep_weights=keep)
        eng.updater.lazy_copies = lazy
        eng.updater.enable([0, 2, 5, 6])
        losses = []
        for s in range(5):
            if s == 3:
                eng.updater.hand_back(6)   # back to the CPU, as balance.py may do
            losses.append(eng.train_step(batch(s)))
            eng.synchronize()
            for g in range(1, len(eng.groups)):
                if g not in eng.host.stale:
                    assert torch.equal(eng.host.copy[g], eng.host.master[g].to(BF16)), (s, g)
        runs.append((losses, eng.updater.bytes_d2h, set(eng.host.stale),
                     [m.clone() for m in eng.host.master], eng.cache.bytes_h2d))
        eng.close()
    (la, da, sa, ma, ha), (lb, db, sb, mb, hb) = runs
    assert la == lb
    assert all(torch.equal(a, b) for a, b in zip(ma, mb))
    assert sa == set() and 2 in sb and (5 in sb) == keep and 6 not in sb
    assert db < da
    # a forward that meets a stale copy loads the fp32 master (4 B/param, not 2)
    assert hb >= ha and (hb - ha) % (2 * model_numel(model, 6)) == 0
