"""Save at step k, load into a new engine, continue: identical to never stopping."""

import copy

import pytest
import torch

import outcore

from .models import batch_for, make


@pytest.mark.parametrize("clip", [None, 1.0])
def test_resume_equals_uninterrupted(tmp_path, clip):
    torch.manual_seed(5)
    base = make("decoder")
    gen = torch.Generator().manual_seed(6)
    batches = [batch_for("decoder", gen) for _ in range(5)]
    opt = outcore.AdamW(lr=2e-3, eps=1e-6, weight_decay=0.05)

    a = outcore.Engine(copy.deepcopy(base), optimizer=opt, device="cpu", max_grad_norm=clip)
    want = [a.train_step(b) for b in batches]

    b = outcore.Engine(copy.deepcopy(base), optimizer=opt, device="cpu", max_grad_norm=clip)
    got = [b.train_step(x) for x in batches[:2]]
    b.save(tmp_path / "ck")
    b.close()
    fresh = make("decoder")  # different random init: everything must come from the file
    c = outcore.Engine.load(tmp_path / "ck", fresh, device="cpu", max_grad_norm=clip)
    assert c.step_count == 2
    got += [c.train_step(x) for x in batches[2:]]
    assert got == pytest.approx(want, rel=1e-6)
    for (n, p), (_, q) in zip(a.model.named_parameters(), c.model.named_parameters()):
        assert torch.equal(p, q), n
    a.close()
    c.close()


def test_save_is_atomic(tmp_path, monkeypatch):
    """A crash while writing leaves the previous checkpoint intact and no temp dir."""
    eng = outcore.Engine(make("decoder"), device="cpu")
    eng.train_step(batch_for("decoder", torch.Generator().manual_seed(0)))
    eng.save(tmp_path / "ck")
    before = (tmp_path / "ck" / "master.safetensors").read_bytes()
    eng.train_step(batch_for("decoder", torch.Generator().manual_seed(1)))
    import outcore.stream.checkpoint as ckmod

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(ckmod.torch, "save", boom)
    with pytest.raises(OSError):
        eng.save(tmp_path / "ck")
    assert (tmp_path / "ck" / "master.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]
    eng.close()


def test_a_crash_between_the_renames_names_the_checkpoint_before_it(tmp_path, monkeypatch):
    """save over a checkpoint renames it aside, then the new one in: a crash in between
    left no checkpoint at the path, and load said only "not an outcore checkpoint"."""
    import os
    eng = outcore.Engine(make("decoder"), device="cpu")
    eng.train_step(batch_for("decoder", torch.Generator().manual_seed(0)))
    eng.save(tmp_path / "ck")
    real = os.replace

    def crash_second(src, dst):
        if ".tmp-" in str(src):
            raise KeyboardInterrupt   # the process dies here
        return real(src, dst)
    monkeypatch.setattr(os, "replace", crash_second)
    with pytest.raises(KeyboardInterrupt):
        eng.save(tmp_path / "ck")
    monkeypatch.undo()
    eng.close()
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith(".ck.old-")]
    with pytest.raises(outcore.OutcoreError, match=f"is missing.*{old.name}.*rename"):
        outcore.Engine.load(tmp_path / "ck", make("decoder"), device="cpu")
    old.rename(tmp_path / "ck")
    again = outcore.Engine.load(tmp_path / "ck", make("decoder"), device="cpu")
    assert again.step_count == 1
    again.close()


def test_save_flushes_the_directory_holding_the_renames(tmp_path, monkeypatch):
    """The renames are entries of the parent directory: without its fsync a power loss
    could undo them after save returned."""
    import os
    opened, synced = {}, []
    real_open, real_fsync = os.open, os.fsync

    def spy_open(p, flags, *a, **k):
        fd = real_open(p, flags, *a, **k)
        opened[fd] = os.path.abspath(p)
        return fd

    def spy_fsync(fd):
        synced.append(opened.get(fd))
        return real_fsync(fd)
    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    eng = outcore.Engine(make("decoder"), device="cpu")
    eng.save(tmp_path / "ck")
    eng.close()
    assert str(tmp_path) in synced, synced


def test_load_rejects_other_architecture(tmp_path):
    eng = outcore.Engine(make("decoder"), device="cpu")
    eng.save(tmp_path / "ck")
    eng.close()
    with pytest.raises(outcore.OutcoreError, match="same architecture"):
        outcore.Engine.load(tmp_path / "ck", make("gpt2"), device="cpu")
    with pytest.raises(outcore.OutcoreError, match="not an outcore checkpoint"):
        outcore.Engine.load(tmp_path, make("decoder"), device="cpu")
