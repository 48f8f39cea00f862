"""Engine arguments for unusual models: block arguments shared by every sample
(shared_args), float64 models, and parameters rebound through engine.model. Each either
trains exactly like plain PyTorch or is refused with a one-line error."""

import copy

import pytest
import torch
from torch import nn

import outcore
from outcore import OutcoreError

from .testlib import ce, one_line

LR = 3e-3
ROWS = 6   # the batch's rows: the shared table has as many by coincidence
# on a GPU too (fp32 compute, TF32 off), against plain PyTorch on the CPU
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, h, table, scale=None):
        """h: B x 8, table: T x 8 shared by every sample (its mean over T scales h)."""
        return h + torch.tanh(self.lin(h)) * table.mean(0)


class Net(nn.Module):
    def __init__(self, by_keyword: bool):
        super().__init__()
        self.by_keyword = by_keyword
        self.emb = nn.Linear(8, 8)
        self.layers = nn.ModuleList([Blk(), Blk()])
        self.head = nn.Linear(8, 3)
        self.register_buffer("table", torch.randn(ROWS, 8))

    def forward(self, input):
        h = self.emb(input)
        for layer in self.layers:
            h = layer(h, table=self.table) if self.by_keyword else layer(h, self.table)
        return self.head(h)


def data(n=3):
    gen = torch.Generator().manual_seed(2)
    return [{"input": torch.randn(ROWS, 8, generator=gen),
             "y": torch.randint(0, 3, (ROWS,), generator=gen)} for _ in range(n)]


def engine(model, device="cpu", **kw):
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    return outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, weight_decay=0.0),
                          device=device, compute_dtype=torch.float32, **kw)


def plain(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    for b in batches:
        opt.zero_grad()
        ce(model(b["input"]), b).backward()
        opt.step()


def max_diff(a: nn.Module, b: nn.Module) -> float:
    sb = b.state_dict()
    return max((v - sb[k]).abs().max().item() for k, v in a.state_dict().items())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("by_keyword", [False, True])
def test_shared_args_stay_whole_in_micro_batches(by_keyword, device):
    torch.manual_seed(0)
    model = Net(by_keyword)
    ref, split = copy.deepcopy(model), copy.deepcopy(model)
    plain(ref, data())
    eng = engine(model, device, micro_batch_size=2, shared_args=("table",))
    wrong = engine(split, device, micro_batch_size=2)   # the default splits the 6 x 8 table
    for b in data():
        eng.train_step(b, loss_fn=ce)
        wrong.train_step(b, loss_fn=ce)
    assert max_diff(eng.model, ref) < 1e-5
    assert max_diff(wrong.model, ref) > 1e-4   # what shared_args is for
    eng.close()
    wrong.close()


def test_shared_args_naming_no_block_argument_is_one_line():
    with pytest.raises(OutcoreError) as e:
        engine(Net(False), shared_args=("tabel",))
    msg = one_line(e)
    assert "'tabel'" in msg and "'table'" in msg
    with pytest.raises(OutcoreError) as e:
        engine(Net(False), shared_args=3)
    assert "shared_args=3" in one_line(e)


def test_a_float64_model_is_refused_not_trained_in_float32():
    model = Net(False).double()
    before = model.emb.weight.detach().clone()
    with pytest.raises(OutcoreError) as e:
        engine(model)
    msg = one_line(e)
    assert "float64" in msg and "model.float()" in msg
    assert model.emb.weight.dtype == torch.float64 and torch.equal(model.emb.weight, before)


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_rebound_through_model_are_trained_from_their_new_values(device):
    """p.data = t through engine.model: training goes on from t, as in plain PyTorch."""
    torch.manual_seed(0)
    model = Net(False)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=0.0)
    batches = data(4)
    eng = engine(model, device)
    for i, b in enumerate(batches):
        if i == 1:
            new_emb, new_blk = torch.randn(8, 8), torch.randn(8, 8)
            m = eng.model
            m.emb.weight.data = new_emb.clone()            # rest (group 0)
            m.layers[1].lin.weight.data = new_blk.clone()  # a streamed block
            ref.emb.weight.data = new_emb.clone()
            ref.layers[1].lin.weight.data = new_blk.clone()
        eng.train_step(b, loss_fn=ce)
        opt.zero_grad()
        ce(ref(b["input"]), b).backward()
        opt.step()
    got = eng.model
    assert max_diff(got, ref) < 1e-5
    assert (got.layers[1].lin.weight - new_blk).abs().max() < 0.05   # not the old values
    eng.close()


def test_a_parameter_rebound_to_another_shape_is_one_line():
    eng = engine(Net(False))
    eng.train_step(data(1)[0], loss_fn=ce)
    eng.model.layers[0].lin.weight.data = torch.zeros(4, 8)
    with pytest.raises(OutcoreError) as e:
        eng.train_step(data(1)[0], loss_fn=ce)
    msg = one_line(e)
    assert "'layers.0.lin.weight'" in msg and "(4, 8)" in msg and "(8, 8)" in msg
    eng.close()


def test_held_gpu_updates_past_the_block_count_is_one_line():
    with pytest.raises(OutcoreError) as e:
        engine(Net(False), held_gpu_updates=3, max_grad_norm=1.0)
    assert "held_gpu_updates=3" in one_line(e) and "2 blocks" in one_line(e)
