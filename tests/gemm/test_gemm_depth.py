"""Flow control: how far a device's worker may run ahead, and what the model says it costs."""

import numpy as np
import pytest
import torch

from outcore.gemm.model import Rates, estimate_seconds
from outcore.gemm.plan import make_plan
from outcore.gemm.schedule import LONE_DEPTH, Pull, TileQueue


def test_a_lone_device_queues_deeper_than_devices_sharing_tiles():
    assert Pull(TileQueue(range(10), 1), 0).depth() == LONE_DEPTH > 2
    assert Pull(TileQueue(range(10), 2), 1).depth() == 2


def test_model_copy_engine_idles_when_the_host_queues_too_little():
    # bf16 on fp32 host matrices: loads dominate, and runs of tiles whose panels are all
    # cached leave the copy engine idle unless later tiles' loads were already enqueued
    plan = make_plan(32768, 32768, 32768, host_dtype=torch.float32, compute="bf16",
                     budget=110 << 30, tile=(4096, 4096, 32768, 2048))
    r = Rates()
    shallow, deep, free = (estimate_seconds(plan, r, depth=d) for d in (1, 8, 10**9))
    assert shallow > 1.15 * deep
    assert abs(deep - free) < 0.02 * free
    link = 2 * 32768 * 32768 * 4 / r.h2d          # A and B cross once
    assert deep >= link


@pytest.mark.parametrize("pinned", [True, False])
def test_worker_keeps_at_most_depth_tasks_queued(monkeypatch, pinned):
    """The worker waits on its oldest task once `depth` are queued (CPU: tasks are done
    when enqueued, so count the waits). Staged (unpinned) inputs queue only 2: each queued
    load would hold a pinned staging buffer."""
    import outcore.gemm.worker as w
    from outcore.gemm.hostmat import HostMatrix
    waits = []
    monkeypatch.setattr(w, "host_wait", lambda ev: waits.append(ev))
    if pinned:    # the CPU path never uses DMA: only the worker's depth choice sees this
        init = HostMatrix.__init__

        def pinned_init(self, *a, **k):
            init(self, *a, **k)
            self.pinned = True
        monkeypatch.setattr(HostMatrix, "__init__", pinned_init)
    A, B = np.ones((64, 32), np.float32), np.ones((32, 64), np.float32)
    from outcore.gemm import matmul
    out, st = matmul(A, B, devices="cpu", tile=16, return_stats=True)
    assert np.allclose(out, 32.0)
    # 16 tiles, the last one cut in 4 strips: 19 tasks of one tile; a wait before each pull
    # once `depth` are queued, the last pull (which finds the queue empty) included
    assert st.devices[0].tiles == 19
    assert len(waits) == 19 - (LONE_DEPTH if pinned else 2) + 1
