"""Session 42's adversarial review of the engine with user-defined models (CPU): each case
trains like plain PyTorch + torch.optim.AdamW, or is refused in one line, never trained
wrongly without a word."""

import copy

import pytest
import torch
from torch import nn

import outcore
from outcore import OutcoreError

from .testlib import EPS, LR, WD, ce, engine, one_line


def batches(n=3, rows=5, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(rows, 8, generator=gen),
             "y": torch.randint(0, 3, (rows,), generator=gen)} for _ in range(n)]


class Block(nn.Module):
    def __init__(self, d=16, h=16):
        super().__init__()
        self.a, self.b = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class Net(nn.Module):
    """An embedding, a list of blocks under a name the engine does not know, a head."""

    def __init__(self, sizes=(16, 16, 16), block=Block):
        super().__init__()
        self.emb = nn.Linear(8, 16)
        self.stack = nn.ModuleList(block(16, h) for h in sizes)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.emb(x)
        for blk in self.stack:
            h = blk(h)
        return self.head(h)


def assert_trains_like_pytorch(model, data, **kw):
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS, weight_decay=WD)
    want = []
    for b in data:
        opt.zero_grad()
        loss = ce(ref(b["x"]), b)
        loss.backward()
        opt.step()
        want.append(loss.item())
    eng = engine(model, **kw)
    got = [eng.train_step(b, loss_fn=ce) for b in data]
    assert got == pytest.approx(want, rel=1e-5)
    ours = dict(eng.model.named_parameters())
    for name, p in ref.named_parameters():
        err = ((ours[name] - p).norm() / p.norm().clamp(min=1e-12)).item()
        assert err < 1e-4, (name, err)
    return eng


def test_a_model_of_one_block_is_found_and_trains_like_pytorch():
    """A block list of one entry (an HF config with num_hidden_layers=1 too) was refused
    as 'it has no nn.ModuleList or nn.Sequential of layers'."""
    torch.manual_seed(0)
    eng = assert_trains_like_pytorch(Net(sizes=(16,)), batches())
    assert eng.blocks_path == "stack" and len(eng.groups) == 2
    eng.close()


class _CondBlock(Block):
    def forward(self, x, c):
        return super().forward(x) + c


class _Conditioned(Net):
    """Each block gets a learned conditioning tensor computed outside the blocks."""

    def __init__(self):
        super().__init__(block=_CondBlock)
        self.cond = nn.Linear(8, 16)

    def forward(self, x):
        h, c = self.emb(x), self.cond(x)
        for blk in self.stack:
            h = blk(h, c)
        return self.head(h)


def test_a_block_argument_that_needs_a_gradient_is_refused():
    """Its gradient through the blocks was dropped without a word (cond.bias 3% off plain
    PyTorch after 3 steps): BlockFn passes gradients to the hidden state and the block's
    weights only."""
    torch.manual_seed(0)
    eng = engine(_Conditioned())
    with pytest.raises(OutcoreError) as e:
        eng.train_step(batches()[0], loss_fn=ce)
    msg = one_line(e)
    assert "'stack.0'" in msg and "needs a gradient" in msg and "rejected" not in msg
    eng.close()


class _KwBlock(Block):
    def forward(self, x, scale=1.0):
        return super().forward(x) * scale


class _ByKeyword(Net):
    def __init__(self):
        super().__init__(block=_KwBlock)

    def forward(self, x):
        h = self.emb(x)
        for blk in self.stack:
            h = blk(x=h, scale=0.5)   # the hidden state by its own name
        return self.head(h)


def test_a_block_called_with_its_input_by_keyword_trains_like_pytorch():
    """blk(x=h) was "the model's forward rejected the batch: 'hidden_states'"."""
    torch.manual_seed(0)
    assert_trains_like_pytorch(_ByKeyword(), batches(), micro_batch_size=2).close()


class _AuxBlock(Block):
    def forward(self, x):
        h = super().forward(x)
        return h, h.pow(2).mean()   # an auxiliary loss, as an MoE block's balance loss


class _WithAux(Net):
    def __init__(self):
        super().__init__(block=_AuxBlock)

    def forward(self, x):
        h, aux = self.emb(x), 0.0
        for blk in self.stack:
            h, a = blk(h)
            if a is not None:
                aux = aux + a
        return self.head(h) + 0.1 * aux


def test_a_block_returning_a_second_tensor_is_refused():
    """The engine hands None in its place: the auxiliary loss vanished from training and
    the step ran, its numbers silently off plain PyTorch's."""
    torch.manual_seed(0)
    eng = engine(_WithAux())
    with pytest.raises(OutcoreError) as e:
        eng.train_step(batches()[0], loss_fn=ce)
    assert "tensor at [1]" in one_line(e)
    eng.close()


@pytest.mark.parametrize("sizes", [(16, 16, 16, 16), (16, 16)])
def test_load_into_more_or_fewer_blocks_names_the_first_parameter(tmp_path, sizes):
    """It said only '16 parameters saved, 20 here'."""
    torch.manual_seed(0)
    eng = engine(Net())
    eng.train_step(batches()[0], loss_fn=ce)
    eng.save(tmp_path / "ck")
    eng.close()
    with pytest.raises(OutcoreError) as e:
        outcore.Engine.load(tmp_path / "ck", Net(sizes), device="cpu")
    msg = one_line(e)
    assert ("stack.3.a.weight [16, 16] here, not saved" in msg if len(sizes) > 3 else
            "stack.2.a.weight [16, 16] saved, not here" in msg), msg
