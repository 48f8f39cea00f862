"""bench/stream.py's outcore worker warms up past --warmup while the planner still moves
groups' AdamW to the device, so no move lands inside the measured steps."""

import argparse
from types import SimpleNamespace

import pytest
import torch

from .test_stream_append import load_stream_bench


class FakeEngine:
    """Moves one more group to the device after each step listed in `moves_after`."""

    moves_after: tuple = ()
    tuning_until = 0   # the tuner (if any) is busy through this step

    def __init__(self, model, **kw):
        self.n = 0
        self.host_weight_copy = kw.get("host_weight_copy")
        self.max_staged_grads = None   # as Engine resolves it where the host has room
        self.schedule = SimpleNamespace(order="arrival")
        self.runner = SimpleNamespace(tail=SimpleNamespace(enabled=True, skipping=lambda: []))
        tuner = SimpleNamespace(busy=lambda: self.n < self.tuning_until, log=[]) \
            if self.tuning_until else None
        self.updater = SimpleNamespace(order="tail", tuner=tuner, groups=set(), balancer=None,
                                       resident=SimpleNamespace(blocks=lambda: []))
        self.stats = SimpleNamespace(compute_s=0.1, copy_wait_s=0.0, optimizer_wait_s=0.0,
                                     forward_s=0.03, backward_s=0.07,
                                     peak_device_bytes=0, peak_reserved_bytes=0,
                                     alloc_retries=0, kept_blocks=0)
        self.stash = SimpleNamespace(bytes_offloaded=0)
        self.deferred = SimpleNamespace(groups=set())
        self.groups = [SimpleNamespace(numel=10) for _ in range(40)]

    def train_step(self, batch):
        self.n += 1
        if self.n in self.moves_after:
            self.updater.groups.add(len(self.updater.groups))
        return 1.0 / self.n

    def synchronize(self):
        pass

    def host_bytes_per_param(self):
        return 12.0


@pytest.mark.parametrize("moves_after,tuning_until,warmup_steps,settled", [
    ((1, 3), 0, 6, True),          # settled within --warmup: no extra steps
    ((1, 3, 5, 7), 0, 10, True),   # the last move after step 7: 3 quiet steps more
    (tuple(range(1, 40)), 0, 6 + 4, False),   # never settles: capped by --max-extra-warmup
    ((1,), 8, 8, True),            # the tuner's trials run through step 8
    ((1,), 30, 6 + 4, False),      # ... or past the cap
])
def test_warmup_waits_for_the_planner(monkeypatch, moves_after, tuning_until, warmup_steps,
                                      settled):
    bench = load_stream_bench()
    import outcore
    monkeypatch.setattr(outcore, "Engine", type("E", (FakeEngine,), {
        "moves_after": moves_after, "tuning_until": tuning_until}))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    # the fake engine has no CUDA streams to report, on a GPU machine too
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = argparse.Namespace(size="tiny", layers=None, fused_norm=False, compiled=False,
                              micro=0, clip=None, held_gpu_updates="0", gpu_memory=None,
                              full_recompute=False, update_order="tail", tune_updates=False,
                              tokens=64, seq=16, warmup=6, steps=5, max_extra_warmup=4,
                              profile=False, host_weight_copy=False, device_weight_copy=False,
                              tune_trials=4,
                              settle_compiles=False, gpu_updates="balance", no_keep_weights=False,
                              lazy_copies=False, resident_mv=0, rest_mv_on_h2d=False,
                              fused_copy=False, no_host_weight_copy=False,
                              balance_model="queues", cpu_rate="last", balance_head=None,
                              block_slots=3, max_staged_grads=None, cpu_order="arrival",
                              copy_stores="cached")
    r = bench.run_outcore(args)
    assert r["warmup_steps"] == warmup_steps and r["plan_settled"] is settled
    # a planner that never settles moves after measured steps too, and the row says so
    measured = range(warmup_steps + 1, warmup_steps + 6)   # their train_step counts
    assert r["measured_moves"] == sum(n in moves_after for n in measured)
    assert r["measured_moves"] == (5 if moves_after == tuple(range(1, 40)) else 0)
    assert len(r["losses"]) == warmup_steps + 5
