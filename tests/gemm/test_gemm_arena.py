"""The per-product arena (gemm/arena.py): one allocation holds every buffer of a product,
and a larger product hands the allocator's cache back before it allocates."""

import pytest
import torch

from gemm_testlib import fake_stats
from outcore.gemm import arena as arena_mod
from outcore.gemm.arena import ALIGN, Arena
from outcore.gemm.matmul import execute
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.plan import make_plan
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.worker import DeviceWorker, GemmJob


def test_take_aligns_views_and_refuses_past_the_end():
    a = Arena(torch.device("cpu"), 3 * ALIGN)
    x = a.take(3, torch.float32)           # 12 bytes, then the next view starts at ALIGN
    y = a.take(ALIGN // 8, torch.float64)
    assert x.dtype == torch.float32 and x.numel() == 3
    assert y.data_ptr() - x.data_ptr() == ALIGN
    with pytest.raises(RuntimeError, match="undercounts"):
        a.take(ALIGN, torch.float32)


def test_every_buffer_of_a_product_is_a_view_of_the_arena(monkeypatch):
    """fp64 host, bf16-style conversion needs landing and C buffers: all inside one
    allocation, which the plan's device_bytes (plus alignment) bounds."""
    m, n, k = 300, 200, 500
    A, B = torch.randn(m, k, dtype=torch.float64), torch.randn(k, n, dtype=torch.float64)
    C = torch.zeros(m, n, dtype=torch.float64)
    plan = make_plan(m, n, k, host_dtype=torch.float64, compute="fp32", budget=1 << 20,
                     n_devices=1, device_type="cpu", layout=(False, False))
    seen = []

    class Spy(DeviceWorker):
        def _loop(self, pull, first):
            super()._loop(pull, first)
            seen.append((self, self.arena.buf,
                         self.cache._bufs + self.accs + self.cbufs + self.landing))

    stats = GemmStats(m, n, k, "fp32", plan="", devices=[DeviceStats("cpu")])
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(C, "out"),
                  ta=False, tb=False, alpha=1.0, beta=0.0)
    execute(job, [torch.device("cpu")], stats, worker_cls=Spy)
    torch.testing.assert_close(C, A @ B, rtol=1e-4, atol=1e-4)
    w, buf, views = seen[0]
    base, size = buf.data_ptr(), buf.numel()
    bufs = [b for b in views if b is not None]
    assert len(bufs) >= 3
    for b in bufs:
        assert base <= b.data_ptr() and b.data_ptr() + b.numel() * b.element_size() <= base + size
    assert size <= plan.device_bytes() + Arena.slack(
        plan.n_slots + plan.n_acc + 4 + plan.tail_tasks)
    # once the product is done the worker holds no view of its arena (its segment is free
    # for the next product even if the worker lives on)
    assert w.arena is None and w.cache is None and not (w.accs or w.cbufs or w.landing)


def test_an_arena_no_cached_block_holds_empties_the_cache_first(monkeypatch):
    """The rule of _make_room by the snapshot (no last arena to go by), with the allocator
    faked: an arena that a freed cached block holds reuses it; one that none holds empties
    the cache first, when something is cached; what earlier products made does not matter
    (an empty_cache by someone else)."""
    calls = []
    state = {"reserved": 0, "allocated": 0, "free": []}
    monkeypatch.setattr(arena_mod, "_FREED", {})      # no last arena: every call asks
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict",
                        lambda d=None: fake_stats(state["reserved"], state["allocated"]))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: [
        {"device": 0, "blocks": [{"state": "inactive", "size": n} for n in state["free"]]
         + [{"state": "active_allocated", "size": 64 << 20}]},
        {"device": 1, "blocks": [{"state": "inactive", "size": 1 << 30}]}])
    dev = torch.device("cuda", 0)
    arena_mod._make_room(dev, 8 << 20)          # the first: nothing to hand back
    state["reserved"], state["free"] = 8 << 20, [8 << 20]   # ... then freed into the cache
    arena_mod._make_room(dev, 6 << 20)          # a cached block holds it: reused
    assert calls == []
    arena_mod._make_room(dev, 9 << 20)          # none holds it (device 1's does not count)
    assert calls == ["empty"]
    state["allocated"] = state["reserved"]      # still in use: nothing cached
    state["free"] = []
    arena_mod._make_room(dev, 12 << 20)
    assert calls == ["empty"]
    # the cache was emptied by someone else, then a smaller product ran and was freed:
    # the next, larger one empties again (a remembered largest arena skipped this)
    state["allocated"], state["reserved"], state["free"] = 0, 2 << 20, [2 << 20]
    arena_mod._make_room(dev, 4 << 20)
    assert calls == ["empty", "empty"]


def test_an_arena_after_its_predecessor_skips_the_snapshot_only_if_nothing_changed(
        monkeypatch):
    """arena.SKIP_SNAPSHOT: the next arena no larger than the last one freed on the device,
    with no allocation and the same reserved and allocated bytes since, takes the freed
    block without a snapshot; a larger one, or any allocation in between, asks the
    snapshot (and empties the cache if no freed block holds it)."""
    snaps, empties = [], []
    state = {"reserved": 0, "allocated": 0, "allocs": 0, "free": []}

    def stats(d=None):
        st = fake_stats(state["reserved"], state["allocated"])
        st["allocation"] = {"all": {"allocated": state["allocs"]}}
        return st

    def snapshot():
        snaps.append(1)
        return [{"device": 0, "blocks": [{"state": "inactive", "size": n}
                                         for n in state["free"]]}]

    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", stats)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", snapshot)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: empties.append(1))
    monkeypatch.setattr(arena_mod, "_index", lambda device: 0)
    monkeypatch.setattr(arena_mod, "_FREED", {})
    dev = torch.device("cuda", 0)

    def made(n):            # Arena(dev, n) on the faked allocator
        arena_mod._make_room(dev, n)
        state["allocs"] += 1
        if state["free"] and max(state["free"]) >= n:
            state["free"] = []              # the freed block holds it (and the rest of it)
        else:
            state["reserved"] += n
        state["allocated"] += n
        a = object.__new__(Arena)
        a.buf = type("Buf", (), {"device": dev, "numel": lambda self: n})()
        return a

    def freed(a, n):
        state["allocated"] -= n
        state["free"] = [n]
        a.release()

    a = made(8 << 20)                        # nothing cached: no snapshot needed
    freed(a, 8 << 20)
    assert (snaps, empties) == ([], [])
    a = made(6 << 20)                        # fits the last freed arena, nothing since
    assert (snaps, empties) == ([], [])
    freed(a, 6 << 20)
    state["allocs"] += 1                     # someone allocated (and freed) in between
    a = made(6 << 20)
    assert snaps == [1] and empties == []    # the snapshot decides: 6 MiB still fits
    freed(a, 6 << 20)
    made(12 << 20)                           # larger than the last arena: snapshot, empty
    assert snaps == [1, 1] and empties == [1]


def test_cached_unused_bytes_reads_the_allocators_nested_stats_once(monkeypatch):
    """reserved - allocated from one read of the nested dict; 0 before the allocator has
    been used (torch returns an empty dict then)."""
    from outcore.memory import cached_unused_bytes
    reads = []

    def stats(d=None):
        reads.append(d)
        return fake_stats(26 << 30, 2 << 30) if len(reads) == 1 else {}
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", stats)
    dev = torch.device("cuda", 0)
    assert cached_unused_bytes(dev) == 24 << 30 and reads == [dev]
    assert cached_unused_bytes(dev) == 0
