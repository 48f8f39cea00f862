"""PeakWatch: the device peak outside the checkpoints, interval by interval (peaks.py)."""

import torch

import outcore
from outcore.stream.peaks import PeakWatch
from .models import batch_for


class FakeStash:
    """What PeakWatch reads of the stash: checkpoint bytes, and what shares their room."""

    def __init__(self):
        self.device_bytes = 0
        self.beside = 0

    def held_bytes(self) -> int:
        return self.device_bytes + self.beside


class FakeAllocator:
    """Peak counters of a device whose allocations are the checkpoints plus `other`."""

    def __init__(self, stash):
        self.stash, self.other, self.peak = stash, 0, 0
        self.resets = 0

    def now(self, other: int) -> None:   # an allocation state inside the interval
        self.other = other
        self.peak = max(self.peak, self.stash.held_bytes() + other)

    def read(self):
        return self.peak, self.peak + 7

    def reset(self):
        self.resets += 1
        self.peak = self.stash.held_bytes() + self.other


def test_other_peak_is_taken_where_it_happens_not_at_the_checkpoints_peak():
    stash = FakeStash()
    dev = FakeAllocator(stash)
    w = PeakWatch(stash, dev.read, dev.reset)
    w.begin_step()
    for _ in range(4):               # forward: a checkpoint of 10 per block, 5 of work
        dev.now(5)
        stash.device_bytes += 10
        dev.now(0)
        w.mark()
    for k in range(4):               # backward: late blocks hold 30 more (device m, v)
        stash.device_bytes -= 10
        dev.now(8 + (30 if k >= 2 else 0))
        dev.now(0)
        w.mark()
    # The step's peak (48, at the 3rd backward block, 10 of it checkpoints) less the
    # checkpoints' own peak (40) would leave 8; the rest really reached 38.
    assert w.step_other == 38
    assert w.peak_allocated == 48 and w.peak_reserved == 55
    assert dev.resets == 9


def test_kept_weights_count_as_held_like_checkpoints():
    # keep.py's copies share the checkpoints' room: a late-backward interval holding 20 of
    # them (made there, used by the next forward) is not "other" work.
    stash = FakeStash()
    dev = FakeAllocator(stash)
    w = PeakWatch(stash, dev.read, dev.reset)
    w.begin_step()
    dev.now(6)
    w.mark()                 # KeptWeights.offer: the interval closes before the copy
    stash.beside = 20        # the copy is made
    dev.now(6)
    w.rebase()               # and is held from the new interval's start
    dev.now(9)
    w.mark()
    assert w.step_other == 9
    assert w.peak_allocated == 29
    stash.beside = 30        # without rebase, a copy counts as other in its interval
    dev.now(6)
    w.mark()
    assert w.step_other == 16


def test_cpu_watch_is_inactive_and_the_engine_marks_every_block():
    eng = outcore.Engine(outcore.models.decoder("tiny", layers=3, vocab=96, max_seq=64),
                         device="cpu")
    assert not eng.peaks.active
    stash = eng.stash
    dev = FakeAllocator(stash)
    eng.peaks = PeakWatch(stash, dev.read, dev.reset)
    gen = torch.Generator().manual_seed(0)
    eng.train_step(batch_for("decoder", gen, rows=4))
    n_blocks = len(eng.groups) - 1
    # begin_step, then a mark after each block's forward and backward and one at the end
    assert dev.resets == 1 + 2 * n_blocks + 1
    assert eng._other_peak == eng.peaks.step_other
    eng.close()


def test_cuda_read_takes_both_peaks_from_one_stats_read(monkeypatch):
    from outcore.stream import peaks
    calls = []

    def stats(device):
        calls.append(device)
        return {"allocated_bytes": {"all": {"peak": 5, "current": 1}},
                "reserved_bytes": {"all": {"peak": 9, "current": 2}}}
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", stats)
    assert peaks._cuda_read(0)() == (5, 9)
    assert calls == [0]
