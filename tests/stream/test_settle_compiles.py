"""DeviceUpdater.settle_compiles: the device-update planner does not plan from a step in
which torch.compile built kernels (that step's optimizer wait measured the compiler, not
the CPU AdamW); without the option it plans after steps 2..8 as before."""

import pytest
import torch

import outcore
from outcore.models import decoder
from outcore.stream import accounting


@pytest.mark.parametrize("settle,planned", [(False, [2, 3, 4, 5, 6]), (True, [4, 5, 6])])
def test_no_planning_from_a_step_that_compiled(monkeypatch, settle, planned):
    counts = iter([0, 5, 9, 9, 9, 9, 9])   # kernels built during steps 2 and 3
    monkeypatch.setattr(accounting, "compile_count", lambda: next(counts))
    torch.manual_seed(0)
    eng = outcore.Engine(decoder("tiny"), device="cpu")
    eng.gpu_updates = "auto"             # as on CUDA
    eng.updater.settle_compiles = settle
    calls = []
    monkeypatch.setattr(eng.updater, "plan",
                        lambda *a: calls.append(eng.step_count) or [])
    x = torch.randint(0, 256, (2, 16))
    for _ in range(6):
        eng.train_step({"input_ids": x, "labels": x})
    assert calls == planned


def test_compile_count_counts_compiled_graphs():
    from outcore.models.kernels import Kernels
    before = accounting.compile_count()
    # a shape no other test compiles: a cached graph would count nothing
    Kernels(compiled=True).swiglu(torch.randn(5, 11), torch.randn(5, 11))
    assert accounting.compile_count() > before
