"""DeviceUpdater.resident_mv: the m and v of the first device-updated blocks of backward
stay on the device between steps. Training is bit for bit the same as with them streamed;
the host's m, v are current after synchronize() and when a group's AdamW goes back to the
CPU (hand_back), and fewer bytes go out."""

import copy

import torch

import outcore
from outcore.models import decoder

BF16 = torch.bfloat16


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (4, 32), generator=g)
    return {"input_ids": x, "labels": x}


def run(model, resident: int, steps: int = 5, back_at: int = 3):
    eng = outcore.Engine(copy.deepcopy(model), optimizer=outcore.AdamW(lr=1e-2),
                         device="cpu", compute_dtype=BF16, host_weight_copy=True)
    eng.updater.resident_mv = resident
    eng.updater.enable([0, 2, 3, 5, 6])
    losses, held = [], []
    for s in range(steps):
        if s == back_at:
            eng.updater.hand_back(6)   # resident: its m, v go back before the CPU's update
        losses.append(eng.train_step(batch(s)))
        held.append(eng.updater.resident.blocks())
    eng.synchronize()
    state = [t.clone() for t in eng.host.master + eng.opt.m + eng.opt.v if t is not None]
    out = losses, state, eng.updater.bytes_d2h, eng.updater.bytes_h2d, held
    eng.close()
    return out


def test_resident_m_v_train_the_same_with_fewer_bytes():
    torch.manual_seed(0)
    model = decoder("tiny", layers=8)
    la, sa, da, ha, _ = run(model, 0)
    lb, sb, db, hb, held = run(model, 2)
    assert la == lb
    assert len(sa) == len(sb) and all(torch.equal(a, b) for a, b in zip(sa, sb))
    # blocks 6 and 5 first (backward reaches them first), then 5 and 3 once 6 went back
    assert held[:3] == [[5, 6]] * 3 and held[3:] == [[3, 5]] * 2
    assert db < da and hb < ha
