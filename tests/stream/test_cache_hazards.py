"""DeviceCache ordering with a d2h stream running behind (session 6's host-copy failure on
the H200): the streams are recorded by a fake, so the waits are checked on the CPU."""

import contextlib

import pytest
import torch

from outcore.stream.device import DeviceCache


class RecordingLanes:
    """Lanes with named streams and numbered events; records every (stream, event) wait."""

    cuda = True   # the cache takes the GPU's paths; nothing here touches a device

    def __init__(self):
        self.device = torch.device("cpu")
        self.compute, self.h2d, self.d2h = "compute", "h2d", "d2h"
        self.current = "compute"
        self.waits: list[tuple[str, str]] = []
        self.n = 0

    def event(self, stream=None):
        self.n += 1
        return f"{stream or self.current}#{self.n}"

    def wait(self, stream, event):
        if event is not None:
            self.waits.append((stream, event))

    def timed_wait(self, stream, event):
        self.wait(stream, event)
        return None

    @contextlib.contextmanager
    def on(self, stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before


def cache(n_blocks=5, numel=8):
    lanes = RecordingLanes()
    return DeviceCache(lanes, [4] + [numel] * n_blocks, n_slots=3), lanes


def master(numel=8):
    return torch.zeros(numel)


def test_a_slot_is_not_overwritten_before_its_write_back_has_read_it():
    c, lanes = cache()
    c.acquire(1, master())                     # backward of device-updated block 1
    w32 = c.acquire(1, master())
    c.updated_in_place(1, w32)
    c.release(1, free_after="d2h#writeback")   # the update's write-back reads the slot
    c.acquire(1, master())                     # next forward: a cache hit
    c.release(1)                               # compute alone releases it now
    for g in (2, 3, 4):                        # later blocks take the free slots
        c.acquire(g, master())
        c.release(g)
    assert ("h2d", "d2h#writeback") in lanes.waits


def test_only_the_slot_the_update_wrote_stays_current():
    c, _ = cache()
    old = c.acquire(1, master())               # block 1 still on the CPU AdamW
    c.release(1)
    c.invalidate(1)                            # its CPU update: that slot is stale now
    new = c.acquire(2, master()) is not None and c.acquire(1, master())
    assert new.data_ptr() != old.data_ptr()    # a second fp32 slot of block 1
    c.updated_in_place(1, new)                 # block 1's AdamW moved to the device
    c.release(1)
    c.release(2)
    current = [s for s in c.slots if s.group == 1 and s.version == c.versions[1]]
    assert [s.buf.data_ptr() for s in current] == [new.data_ptr()]


def test_rest_is_not_reloaded_over_its_write_back():
    c, lanes = cache()
    c.acquire_rest(torch.zeros(4))
    c.invalidate(0)                            # rest's AdamW went back to the CPU
    c.acquire_rest(torch.zeros(4), after="d2h#rest-writeback")
    assert ("h2d", "d2h#rest-writeback") in lanes.waits


def test_ring_never_hands_out_a_buffer_not_given_back():
    """Takes out of the order of their gives (backward's first device-updated block takes
    its m, v after the next block's): the third take must not get the held buffer."""
    from outcore.stream.ring import Ring
    from outcore.transfer import Lanes
    ring = Ring(Lanes(torch.device("cpu")), 2, 4)
    a, _ = ring.take()
    b, _ = ring.take()
    ring.give(b, None)
    c, _ = ring.take()
    assert c == b != a
    with pytest.raises(RuntimeError, match="in use"):
        ring.take()
