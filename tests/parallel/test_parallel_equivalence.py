"""2 and 3 gloo ranks train exactly like plain PyTorch on the whole batch; a dead rank is named."""

import copy

import pytest
import torch

import outcore
from outcore.models import decoder

from outcore.parallel import split_rows
from tests.stream.models import batch_for, loss_fn_for, make
from tests.stream.test_equivalence import plain_steps

from .spawn_parallel import run_ranks


def plain(family, rows, steps, clip):
    """Plain PyTorch, whole batch at once: (losses, {name: param}, numel)."""
    torch.manual_seed(1)
    model = make(family)
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(2)
    batches = [batch_for(family, gen, rows=rows) for _ in range(steps)]
    losses = plain_steps(ref, batches, loss_fn_for(family), clip)
    numel = sum(p.numel() for p in ref.parameters())
    return losses, dict(ref.named_parameters()), numel


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def check(got_losses, got_params, want_losses, want_params):
    assert len(got_losses) == len(want_losses)
    for g, w in zip(got_losses, want_losses):
        assert abs(g - w) <= 1e-5 * abs(w), (got_losses, want_losses)
    for name, p in want_params.items():
        assert rel(got_params[name], p.detach()) < 1e-4, name


CASES = [  # family, ranks, rows, shares, clip, micro
    ("decoder", 2, 6, None, 0.05, 2),
    ("decoder", 3, 6, [1, 2, 3], None, None),
    ("list", 2, 7, "measured", 0.5, None),
    ("gpt2", 3, 5, [3, 1, 1], 0.05, None),
]


@pytest.mark.parametrize("family,n,rows,shares,clip,micro", CASES)
def test_ranks_match_whole_batch_training(tmp_path, family, n, rows, shares, clip, micro):
    steps = 3
    cfg = {"family": family, "rows": rows, "steps": steps, "shares": shares, "clip": clip,
           "micro": micro, "out": str(tmp_path / "out")}
    if n == 3 and family == "decoder":
        cfg.update(save_at=2, ckpt=str(tmp_path / "ckpt"))
    rc, errs, _ = run_ranks(cfg, n)
    assert rc == [0] * n, "\n".join(e[-2000:] for e in errs)
    want_losses, want_params, numel = plain(family, rows, steps, clip)
    outs = [torch.load(f"{cfg['out']}.{r}") for r in range(n)]
    for o in outs:  # every rank reports the whole batch's loss and the same full weights
        check(o["losses"], o["params"], want_losses, want_params)
    # rows really split per the shares (unequal where asked), summing to the batch
    rows_per_rank = [o["rows"][0] for o in outs]
    assert sum(rows_per_rank) == rows
    if isinstance(shares, list):
        assert rows_per_rank == split_rows(rows, shares) and len(set(rows_per_rank)) > 1
    # host state (master + m + v) is 1/N of the total on each rank
    total = 12 * outs[0]["padded"]
    assert sum(o["state_bytes"] for o in outs) == total
    for o in outs:
        assert o["state_bytes"] == total // n
        assert o["state_bytes"] <= 12 * numel / n + 12 * 64
    if "resumed_losses" in outs[0]:  # save at step 2 + load into a fresh engine + step 3
        for o in outs:
            check(o["resumed_losses"], o["resumed_params"], want_losses[2:], want_params)
    if shares == "measured":
        assert outs[0]["shares"] and abs(sum(outs[0]["shares"][-1]) - 1) < 1e-9


def test_lazy_ranks_fill_their_shards_as_one_process_fills_the_whole(tmp_path):
    """A model on the meta device: each rank makes only its slices real, and they are the
    single-process engine's weights (the same seed), through training and a resume."""
    n, rows, steps = 2, 6, 3
    cfg = {"family": "decoder", "lazy": True, "try_copies": True, "rows": rows, "steps": steps,
           "out": str(tmp_path / "out"), "save_at": 2, "ckpt": str(tmp_path / "ckpt")}
    rc, errs, _ = run_ranks(cfg, n)
    assert rc == [0] * n, "\n".join(e[-2000:] for e in errs)
    torch.manual_seed(1)
    one = outcore.Engine(decoder("tiny", vocab=96, max_seq=64, lazy=True), device="cpu")
    ref = copy.deepcopy(one.model)
    gen = torch.Generator().manual_seed(2)
    batches = [batch_for("decoder", gen, rows=rows) for _ in range(steps)]
    want_losses = plain_steps(ref, batches, None, None)
    outs = [torch.load(f"{cfg['out']}.{r}") for r in range(n)]
    for o in outs:
        check(o["losses"], o["params"], want_losses, dict(ref.named_parameters()))
        check(o["resumed_losses"], o["resumed_params"], want_losses[2:],
              dict(ref.named_parameters()))
        assert o["state_bytes"] == 12 * outs[0]["padded"] // n
        assert "is for one process" in o["copy_error"]   # the default ("auto") keeps none


def test_a_signal_to_one_rank_reaches_every_rank_after_the_same_step(tmp_path):
    """SIGINT to rank 1 alone, before its step 2: the handler runs on both ranks after step
    2 (parallel/signals.py), not on rank 1 only, where a checkpoint's collectives would
    meet the other rank's next step and hang."""
    cfg = {"family": "decoder", "rows": 4, "steps": 4, "signal_rank": 1, "signal_step": 1,
           "out": str(tmp_path / "out")}
    rc, errs, _ = run_ranks(cfg, 2, timeout=60)
    assert rc == [0, 0], "\n".join(e[-2000:] for e in errs)
    outs = [torch.load(f"{cfg['out']}.{r}") for r in range(2)]
    assert [o["signalled"] for o in outs] == [[2], [2]]


def test_a_killed_rank_is_named_and_the_others_exit(tmp_path):
    cfg = {"family": "decoder", "rows": 6, "steps": 4, "kill_rank": 1, "kill_step": 1,
           "heartbeat": 5, "out": str(tmp_path / "out")}
    rc, errs, seconds = run_ranks(cfg, 3, timeout=70)
    assert rc[1] != 0  # the killed one
    assert rc[0] != 0 and rc[2] != 0, errs
    assert seconds < 60, seconds
    assert "killed after timeout" not in "".join(errs)
    assert "rank 1" in errs[0] + errs[2], errs
    print(errs[0].strip().splitlines()[-1])


def test_split_rows_follows_shares():
    assert split_rows(10, [1, 1]) == [5, 5]
    assert split_rows(6, [1, 2, 3]) == [1, 2, 3]
    assert split_rows(3, [100, 1, 1]) == [1, 1, 1]  # every rank at least one row
    assert sum(split_rows(101, [0.3, 0.7])) == 101
    with pytest.raises(ValueError):
        split_rows(1, [1, 1])
