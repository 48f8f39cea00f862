"""PinnedPool keeps what it hands out for reuse and forgets it all at close (on a GPU,
close also unregisters the buffers it pinned in place: tests/stream/test_gpu.py)."""

import torch

from outcore.memory import PinnedPool, unpin_all


def test_a_returned_buffer_is_reused_and_close_forgets_every_buffer():
    pool = PinnedPool(pin=False)
    a = pool.get(16, torch.float32)
    pool.put(a)
    assert pool.get(16, torch.float32) is a          # reused, not allocated again
    b = pool.get(16, torch.float32)                  # a is out: a new one
    assert b is not a and pool.bytes_allocated == 2 * 16 * 4
    pool.put(b)
    pool.close()
    assert pool.get(16, torch.float32) is not b      # forgotten: a fresh buffer


def test_unpin_all_without_registrations_leaves_tensors_alone():
    t = torch.ones(8)
    pool = PinnedPool(pin=False)
    pool.put(pool.get(4, torch.float32))
    unpin_all([[t, None]], [pool])
    assert torch.equal(t, torch.ones(8))
