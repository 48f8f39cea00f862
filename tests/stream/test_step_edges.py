"""The step's edges: batch staging, the loss read-back, timings read once their events ran,
and where rest's m, v start in backward."""

import pytest
import torch

import outcore
from outcore import OutcoreError
from outcore.models import decoder
from outcore.stream.edges import StepEdges
from outcore.stream.stats import ComputeTimer
from outcore.transfer import Lanes
from outcore.memory import PinnedPool


class FakeEvent:
    """A timing event whose completion the test decides; elapsed_time in ms, raising like
    torch's when an event has not run (it does not wait)."""

    def __init__(self, t_ms: float, done: bool = True):
        self.t, self.done = t_ms, done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, other: "FakeEvent") -> float:
        if not (self.done and other.done):
            raise RuntimeError("CUDA error: device not ready")
        return other.t - self.t


def test_timer_hands_out_each_step_once_its_events_ran():
    timer = ComputeTimer(cuda=True)
    timer.marks = [(FakeEvent(0), FakeEvent(100))]          # step 1: 0.1 s of compute
    timer.end_step([(FakeEvent(10), FakeEvent(30)), None])  # a 20 ms copy wait
    timer.marks = [(FakeEvent(0), FakeEvent(50))]           # step 2: done
    timer.end_step([])
    timer.marks = [(FakeEvent(0), FakeEvent(70, done=False))]  # step 3: still running
    timer.end_step([])
    assert timer.settled() == [(0.1, 0.02), (0.05, 0.0)]   # not step 3: not run yet
    assert timer.settled() == []                            # each step once
    assert timer.settled(block=True) == [(0.07, 0.0)]       # waits for the rest
    assert timer.settled(block=True) == []


def test_timer_phase_spans_come_with_their_step():
    timer = ComputeTimer(cuda=True)
    timer.bounds = [FakeEvent(0), FakeEvent(30), FakeEvent(100)]   # forward 30, backward 70
    timer.end_step([])
    timer.bounds = [FakeEvent(0), FakeEvent(20), FakeEvent(90, done=False)]
    timer.end_step([])
    assert timer.last_phases == (0.0, 0.0)          # nothing settled yet
    timer.settled()
    assert timer.last_phases == (0.03, 0.07)        # not the step still running
    timer.settled(block=True)
    assert timer.last_phases == (0.02, 0.07)


def test_engine_reports_forward_and_backward_spans():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=1e-3), device="cpu",
                         verbose=False)
    x = torch.randn(8, 16)
    eng.train_step({"input": x}, loss_fn=lambda out, b: out.square().mean())
    st = eng.stats
    assert st.forward_s > 0 and st.backward_s > 0
    assert st.forward_s + st.backward_s <= st.step_s


def test_timer_on_the_cpu_is_immediate():
    timer = ComputeTimer(cuda=False)
    timer.stop(timer.start())
    timer.end_step([])
    (got,) = timer.settled()
    assert got[0] >= 0.0 and got[1] == 0.0
    assert timer.settled() == []              # each step once


def test_engine_totals_count_every_step_once():
    torch.manual_seed(0)
    eng = outcore.Engine(decoder("tiny"), device="cpu")
    b = {"input_ids": torch.randint(0, 256, (2, 16))}
    b["labels"] = b["input_ids"]
    per_step = []
    for _ in range(3):
        eng.train_step(b)
        per_step.append(eng.stats.compute_s)
    eng.synchronize()
    assert eng.stats.compute_s == per_step[-1]      # synchronize settles nothing new here
    assert all(t > 0 for t in per_step)
    assert eng.stats.total_compute_s == pytest.approx(sum(per_step))
    eng.close()


def test_edges_on_the_cpu():
    edges = StepEdges(Lanes(torch.device("cpu")), PinnedPool(pin=False))
    x = torch.arange(6).reshape(2, 3)
    assert edges.to_device(x) is x
    assert edges.to_device("text") == "text"
    edges.post_loss(torch.tensor(2.5, requires_grad=True) * 2)
    assert edges.loss_value() == 5.0


def test_rest_state_starts_ahead_of_the_device_updated_stretch():
    torch.manual_seed(0)
    model = decoder("tiny", layers=8, vocab=512)
    eng = outcore.Engine(model, device="cpu", gpu_updates=2)
    assert eng.updater.groups == {0, 1, 2}
    rest, block = eng.groups[0].numel, eng.groups[1].numel
    lead = -(-3 * rest // (2 * block))
    assert lead >= 1
    assert eng.updater.rest_lead() == min(8, 2 + lead)
    eng.close()
    # only rest on the device: it starts `lead` blocks into backward's end
    eng = outcore.Engine(decoder("tiny", layers=8, vocab=512), device="cpu",
                         gpu_updates=0)
    eng.updater.enable([0])
    assert eng.updater.rest_lead() == min(8, lead)
    eng.close()


def test_rest_gradient_accumulates_in_place():
    """Each rest parameter's .grad is a view of one flat buffer; backward adds into it."""
    torch.manual_seed(0)
    eng = outcore.Engine(decoder("tiny"), device="cpu")
    rest = eng.cache.rest
    leaves = {k: v.detach().requires_grad_(True)
              for k, v in eng.block_params(0, rest).items()}
    flat = eng._accumulate_into(leaves, rest.numel())
    first = next(iter(leaves.values()))
    (first.sum() * 3).backward()
    assert flat[: first.numel()].eq(3).all()
    assert flat[first.numel():].eq(0).all()
    assert first.grad.data_ptr() == flat.data_ptr()
    eng.close()


def test_interleaved_update_order():
    """'interleave' moves rest and blocks 1..3 first, then every other block; rest's m, v
    start relative to the contiguous run at the end of backward."""
    eng = outcore.Engine(decoder("tiny", layers=9, vocab=512), device="cpu", gpu_updates=0)
    assert eng.updater.candidates() == list(range(10))
    eng.updater.order = "interleave"
    assert eng.updater.candidates() == [0, 1, 2, 3, 5, 7, 9, 4, 6, 8]
    eng.updater.enable(eng.updater.candidates()[:6])      # rest, 1, 2, 3, 5, 7
    rest, block = eng.groups[0].numel, eng.groups[1].numel
    assert eng.updater.rest_lead() == min(9, 3 + -(-3 * rest // (2 * block)))
    eng.updater.order = "sideways"
    with pytest.raises(OutcoreError, match="'tail' or 'interleave'"):
        eng.updater.candidates()
    eng.close()
