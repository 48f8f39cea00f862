"""A worker process of spawn_fit that raises a user-facing error: the parent raises that
error itself (type and one-line message), not torch's ProcessRaisedException with the
child's traceback; an internal failure keeps the traceback. Two CPU workers."""

import dataclasses
import os
import pickle

import numpy as np
import pytest
import torch.multiprocessing as mp

import outcore.embed.dist as dist
import outcore.embed.trainer as trainer_mod
from outcore.embed import EmbedConfig, EmbeddingTrainer, childerr
from outcore.embed.graph import csr
from outcore.embed.trainer import as_edgelist
from outcore.errors import OutcoreError

SRC = np.arange(40) % 20
DST = (np.arange(40) * 7 + 1) % 20


def _fit_two_workers(monkeypatch, capacity):
    """fit on cpu, cpu with the plan's capacity replaced: the children's workers refuse
    a capacity of 1 (an OutcoreError) and trip over a str one (a TypeError of '<', an
    internal failure); the spawn's temporary directory is removed either way."""
    real_plan, real_mkdtemp = trainer_mod.make_plan, dist.tempfile.mkdtemp
    made = []
    monkeypatch.setattr(trainer_mod, "make_plan", lambda *a: dataclasses.replace(
        real_plan(*a), capacity=capacity))
    monkeypatch.setattr(dist.tempfile, "mkdtemp",
                        lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])
    tr = EmbeddingTrainer(EmbedConfig(dim=4, epochs=1, devices=["cpu", "cpu"], partitions=4,
                                      progress=False))
    try:
        tr.fit((SRC, DST))
    finally:
        tr.close()
        assert len(made) == 1 and not os.path.exists(made[0])   # the edges' copy is gone


def test_a_user_error_in_a_worker_is_raised_as_itself(monkeypatch):
    with pytest.raises(OutcoreError) as e:
        _fit_two_workers(monkeypatch, 1)
    assert e.type is OutcoreError
    assert str(e.value) == ("the device holds 1 partition(s) but a bucket needs 2: raise "
                            "--gpu-memory or --partitions")
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_an_internal_error_in_a_worker_keeps_its_traceback(monkeypatch):
    with pytest.raises(mp.ProcessRaisedException) as e:
        _fit_two_workers(monkeypatch, "one")
    assert "Traceback" in str(e.value) and "outcore/embed/worker.py" in str(e.value)
    assert "TypeError: '<' not supported" in str(e.value)


def _raised(fn):
    try:
        fn()
    except Exception as e:
        return e
    raise AssertionError("nothing raised")


class _TwoArgs(OutcoreError):
    def __init__(self, a, b):
        super().__init__(f"{a}: {b}")


def test_which_child_errors_count_as_user_facing(tmp_path):
    check = childerr.user_facing
    assert check(_raised(lambda: as_edgelist(([0, 1], [1, 5]), num_nodes=3)))   # OutcoreError
    assert check(_raised(lambda: as_edgelist("edges.tsv")))      # outcore's raise TypeError
    assert not check(_raised(lambda: np.bincount(np.array([-1]))))            # numpy's own
    assert not check(_raised(lambda: csr(3, np.array([0]), "x")))  # an outcore line, no raise
    assert not check(RuntimeError("gloo: connection closed"))
    paths = [str(tmp_path / f"e{r}.pkl") for r in range(3)]
    assert childerr.load(paths, 1) is None                           # no child saved one
    childerr.save(_TwoArgs("a", "b"), paths[0])    # pickles but cannot be rebuilt: kept out
    childerr.save(RuntimeError("bug"), paths[1])   # not user-facing: kept out
    assert childerr.load(paths, 1) is None
    childerr.save(OutcoreError("bad input: fix it"), paths[2])
    got = childerr.load(paths, 1)                  # rank 1 (torch's pick) saved none
    assert type(got) is OutcoreError and str(got) == "bad input: fix it"
    with open(paths[2], "rb") as f:
        assert type(pickle.load(f)) is OutcoreError
