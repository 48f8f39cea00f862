"""HostStore: runs of slabs, reused across sizes, merged on free, bounded, released."""

import pytest
import torch

from outcore import OutcoreError
from outcore.swap import HostStore

KiB = 1024


def test_runs_reuse_freed_space_of_other_sizes():
    s = HostStore(slab_bytes=1024 * KiB, granule=64 * KiB)
    a, b, c = s.alloc(300 * KiB), s.alloc(300 * KiB), s.alloc(300 * KiB)
    assert s.slabs == 1 and s.in_use_bytes == 3 * 320 * KiB
    s.free(a)
    s.free(b)                                   # a and b merge into one 640 KiB hole
    d = s.alloc(600 * KiB)
    assert s.slabs == 1 and d.offset == 0
    s.free(c)
    s.free(d)
    assert s._slabs[0].free == [[0, 1024 * KiB]]   # fully merged again
    assert s.peak_in_use_bytes == 960 * KiB


def test_large_request_gets_its_own_slab_and_views_are_typed():
    s = HostStore(slab_bytes=256 * KiB)
    r = s.alloc(1000 * KiB)
    v = r.view(torch.float32, 1000 * KiB // 4)
    v.copy_(torch.arange(v.numel(), dtype=torch.float32))
    assert s.reserved_bytes == 1024 * KiB and v[-1].item() == v.numel() - 1
    small = s.alloc(10)
    assert small.view(torch.int16, 5).numel() == 5 and s.slabs == 2


def test_limit_gives_a_clear_error():
    s = HostStore(slab_bytes=256 * KiB, limit=512 * KiB)
    s.alloc(256 * KiB)
    s.alloc(200 * KiB)
    with pytest.raises(OutcoreError, match="host_memory") as info:
        s.alloc(300 * KiB)
    assert "\n" not in str(info.value)


def test_release_drops_free_slabs_and_later_frees_drop_the_rest():
    s = HostStore(slab_bytes=256 * KiB)
    a = s.alloc(100 * KiB)
    s.alloc(300 * KiB)                          # second slab
    s.free(s.alloc(10 * KiB))
    s.release()
    assert s.slabs == 2                         # both still hold a run
    s.free(a)
    assert s.slabs == 1 and s.reserved_bytes == 320 * KiB   # 300 KiB in 64 KiB granules


def test_small_slab_keeps_the_pinned_copy_pin_returns(monkeypatch):
    """pin_ returns a pinned copy below its registration size: the slab must use that copy
    (the original stays pageable) and must not unregister it when dropped."""
    import importlib
    host = importlib.import_module("outcore.swap.host")  # outcore.swap is also a function
    copies, unpinned = [], []

    def fake_pin(t):
        copies.append(t.clone())
        return copies[-1]

    monkeypatch.setattr(host, "pin_", fake_pin)
    monkeypatch.setattr(host, "unpin_", lambda t: unpinned.append(t))
    slab = host._Slab(1 << 16, pin=True)
    assert slab.data.data_ptr() == copies[0].data_ptr()
    assert slab.pinned is False
    slab.drop()
    assert unpinned == []
