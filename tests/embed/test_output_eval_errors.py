"""`outcore embed` output safety and `embed eval` input checks: atomic writes, the output
path checked before training, unreadable embeddings, --dim, --device and --holdout errors."""

import argparse
import json
import os

import numpy as np
import pytest
import torch

from outcore.embed.cli import register, run
from outcore.embed.evaluate import evaluate_link_prediction
from outcore.embed.generate import GraphSpec, write_graph
from outcore.embed.output import check_output_path, load_embeddings, save_embeddings
from outcore.embed.table import EmbeddingTable
from outcore.errors import OutcoreError


def _run(*argv):
    p = argparse.ArgumentParser(prog="outcore")
    register(p.add_subparsers(dest="command"))
    return run(p.parse_args(["embed", *argv]))


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    d = tmp_path_factory.mktemp("g")
    e, lab = str(d / "g.tsv"), str(d / "l.tsv")
    write_graph(GraphSpec(300, 4000, communities=4, mixing=0.05, seed=3), e, lab)
    return e, lab


@pytest.mark.parametrize("fmt", ["npy", "safetensors", "tsv"])
def test_a_failed_write_keeps_the_previous_file(tmp_path, fmt, monkeypatch):
    path = str(tmp_path / f"e.{fmt}")
    names = [f"n{i}" for i in range(13)]
    save_embeddings(EmbeddingTable(13, 3, partitions=2, seed=1), path, names=names, chunk=5)
    before = {f: open(f, "rb").read() for f in (path, path + ".ids.tsv")}
    t = EmbeddingTable(13, 3, partitions=2, seed=2)
    calls = []

    def dying_gather(ids):          # the run dies with the second chunk of rows
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return EmbeddingTable.gather(t, ids)
    monkeypatch.setattr(t, "gather", dying_gather)
    with pytest.raises(KeyboardInterrupt):
        save_embeddings(t, path, names=[f"m{i}" for i in range(13)], chunk=5)
    assert {f: open(f, "rb").read() for f in before} == before
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(f) for f in before)
    monkeypatch.undo()
    assert save_embeddings(t, path, names=names) == [path, path + ".ids.tsv"]
    np.testing.assert_allclose(load_embeddings(path), t.gather(np.arange(13)).numpy(),
                               rtol=1e-5, atol=1e-6)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(f) for f in before)


def test_output_path_is_checked_before_reading_or_training(tmp_path):
    (tmp_path / "afile").write_text("x")
    missing = str(tmp_path / "no-such-edges.tsv")   # never read: the --out check comes first
    for out in ("afile/e.npy", "afile/sub/e.npy"):
        with pytest.raises(OutcoreError, match=r"afile is a file, not a directory"):
            _run(missing, "--out", str(tmp_path / out))
    (tmp_path / "d.npy").mkdir()
    with pytest.raises(OutcoreError, match="is a directory"):
        _run(missing, "--out", str(tmp_path / "d.npy"))
    with pytest.raises(OutcoreError, match="cannot tell the format"):
        _run(missing, "--out", str(tmp_path / "e.bin"))
    with pytest.raises(OutcoreError, match="does not exist"):     # a good --out: on to reading
        _run(missing, "--out", str(tmp_path / "new" / "dir" / "e.npy"))
    assert check_output_path(str(tmp_path / "new" / "dir" / "e.npy")) == "npy"
    assert not (tmp_path / "new").exists()                         # checking creates nothing


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_output_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OutcoreError, match="no write permission"):
            check_output_path(str(ro / "e.npy"))
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("holdout", ["1.5", "1", "-0.1", "nan"])
def test_holdout_error_names_the_flag(tmp_path, graph, holdout):
    with pytest.raises(OutcoreError, match=r"--holdout .* must be between 0 and 1"):
        _run(graph[0], "--out", str(tmp_path / "e.npy"), "--holdout", holdout,
             "--devices", "cpu", "--no-progress")


def _bad_files(d):
    np.save(d / "obj.npy", np.array([{"a": 1}, None], dtype=object))
    np.save(d / "vec.npy", np.arange(5.0))
    np.save(d / "cplx.npy", np.ones((3, 2), complex))
    np.save(d / "empty.npy", np.zeros((0, 4), np.float32))
    (d / "zero.npy").write_bytes(b"")
    (d / "junk.npy").write_bytes(b"not an npy file at all")
    (d / "junk.safetensors").write_bytes(b"garbage!garbage!")
    (d / "ragged.tsv").write_text("0\t1\t2\n1\t3\n")
    (d / "text.tsv").write_text("0\t1\t2\n1\t3\tx\n")
    return {"obj.npy": "pickled Python objects", "vec.npy": r"shape \(5,\)",
            "cplx.npy": "complex128", "empty.npy": r"shape \(0, 4\)",
            "zero.npy": "not a readable .npy", "junk.npy": "not a readable .npy",
            "junk.safetensors": "not a readable .safetensors",
            "ragged.tsv": "line 2: 1 values after the id, but line 1 has 2",
            "text.tsv": "line 2: a value is not a number"}


def test_unreadable_embeddings_are_one_line_errors(tmp_path, graph):
    for name, why in _bad_files(tmp_path).items():
        with pytest.raises(OutcoreError, match=why) as e:
            _run("eval", "--embeddings", str(tmp_path / name), "--edges", graph[0])
        assert "\n" not in str(e.value)


def test_eval_device_without_cuda_is_a_one_line_error(tmp_path, graph, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    np.save(tmp_path / "e.npy", np.zeros((300, 4), np.float32))
    with pytest.raises(OutcoreError, match="CUDA is not available"):
        _run("eval", "--embeddings", str(tmp_path / "e.npy"), "--edges", graph[0],
             "--device", "cuda")
    with pytest.raises(OutcoreError, match="not a torch device"):
        _run("eval", "--embeddings", str(tmp_path / "e.npy"), "--edges", graph[0],
             "--device", "gpu0")


def test_directed_eval_scores_the_stored_halves(tmp_path, graph, capsys):
    e, lab = graph
    out = str(tmp_path / "d.npy")
    _run(e, "--dim", "6", "--epochs", "2", "--directed", "--out", out, "--devices", "cpu",
         "--no-progress", "--batch-size", "1024")
    capsys.readouterr()
    emb = np.load(out)
    assert emb.shape == (300, 12)
    want = evaluate_link_prediction(emb, *np.loadtxt(e, dtype=np.int64).T, directed=True,
                                    batch_negs=50, uniform_negs=50)
    base = ["eval", "--embeddings", out, "--edges", e, "--labels", lab, "--directed",
            "--json", "--eval-negatives", "50"]
    for extra in ([], ["--dim", "6"]):          # no --dim: read from the file (not 128)
        assert _run(*base, *extra) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["link_prediction"] == pytest.approx(want)
    with pytest.raises(OutcoreError, match=r"--dim 12 does not match .* vectors of size 6"):
        _run(*base, "--dim", "12")
    with pytest.raises(OutcoreError, match=r"--dim 6 does not match .* size 12"):
        _run(*base[:-4], "--dim", "6")           # undirected: all 12 columns are one vector
    np.save(tmp_path / "odd.npy", np.zeros((300, 5), np.float32))
    with pytest.raises(OutcoreError, match="5 columns, but --directed"):
        _run("eval", "--embeddings", str(tmp_path / "odd.npy"), "--edges", e, "--directed")
    with pytest.raises(OutcoreError, match=r"dim=128 does not match"):
        evaluate_link_prediction(emb, [0], [1], directed=True, dim=128)
