"""The GPU-side bookkeeping (pinned staging of inputs, the writer thread for outputs, events
for buffer reuse, the conversion landing buffers) driven on the CPU by lanes that claim to
be CUDA: every copy then takes the staging path a GPU takes for pageable host data."""

import contextlib
from dataclasses import replace

import pytest
import torch

from gemm_testlib import check_close
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.matmul import execute
from outcore.gemm.plan import make_plan
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.worker import DeviceWorker, GemmJob


class _Event:
    def __init__(self):
        self.synced = False

    def query(self):
        return True

    def synchronize(self):
        self.synced = True


class FakeCudaLanes:
    """Lanes that take the CUDA branches; streams are None, events are done at once."""
    cuda = True

    def __init__(self, device):
        self.device = device
        self.compute = self.h2d = self.d2h = None
        self.events = []

    def event(self, stream=None):
        self.events.append(_Event())
        return self.events[-1]

    def wait(self, stream, event):
        pass

    def on(self, stream):
        return contextlib.nullcontext()


class StagingWorker(DeviceWorker):
    def _make_lanes(self):
        self.fake = FakeCudaLanes(self.device)
        return self.fake


@pytest.mark.parametrize("compute,dtype,prologue", [("fp32", torch.float32, 0),
                                                    ("bf16", torch.float32, 2),
                                                    ("fp32", torch.float64, 0),
                                                    ("fp64", torch.bfloat16, 3)])
def test_staged_copies_and_writer_thread_give_exact_results(compute, dtype, prologue):
    g = torch.Generator().manual_seed(7)
    A = torch.randn(30, 50, generator=g).to(dtype)[:, ::2]      # strided: never direct
    B = torch.randn(17, 25, generator=g).to(dtype)              # used as B.T (transb)
    C0 = torch.randn(30, 17, generator=g).to(dtype)
    out = C0.clone()
    plan = make_plan(30, 17, 25, host_dtype=dtype, compute=compute, budget=1 << 20,
                     tile=(8, 6, 25, 4), device_type="cpu")
    if prologue:
        plan = replace(plan, prologue=prologue, n_acc=plan.n_tiles)
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(out, "out"),
                  ta=False, tb=True, alpha=1.5, beta=0.5)
    st = GemmStats(30, 17, 25, compute, "", devices=[DeviceStats("cpu#0"), DeviceStats("cpu#1")])
    execute(job, [torch.device("cpu")] * 2, st, worker_cls=StagingWorker)
    tol = "bf16" if torch.bfloat16 in (dtype,) or compute == "bf16" else "fp32"
    check_close(out, *(x.double().numpy() for x in (A, B, C0)), 1.5, 0.5, tol, transb=True)
    moved_in = sum(d.h2d_bytes for d in st.devices)
    staged = sum(d.staged_bytes for d in st.devices)
    # every byte in (A, B, C for beta) and out went through a staging buffer
    assert staged == moved_in + sum(d.d2h_bytes for d in st.devices)
    assert sum(d.tiles for d in st.devices) == plan.n_tiles


def test_2d_copy_refuses_rows_that_overlap():
    """An expanded (stride-0) row view has no row pitch: the 2-D DMA must not read past it."""
    from outcore.gemm.cudacopy import _geometry
    row = torch.arange(6, dtype=torch.float32).view(1, 6)
    assert _geometry(row.expand(4, 6)) is None
    assert _geometry(torch.zeros(6, 1).expand(6, 4).t()) is None
    region = torch.zeros(5, 7)[1:4, 2:6]
    _, pitch, width, rows = _geometry(region)
    assert (pitch, width, rows) == (7 * 4, 4 * 4, 3)
