"""`outcore embed` through argparse, and the chunked planted-community generator."""

import argparse
import json

import numpy as np
import pytest

from outcore.embed.cli import register, run
from outcore.embed.generate import GraphSpec, PlantedGraph, write_graph
from outcore.embed.graph import read_edges
from outcore.errors import OutcoreError


def _parser():
    p = argparse.ArgumentParser(prog="outcore")
    register(p.add_subparsers(dest="command"))
    return p


def test_generator_writes_exact_edge_count_in_chunks(tmp_path):
    spec = GraphSpec(500, 5000, communities=5, mixing=0.1, seed=1)
    e, lab = str(tmp_path / "g.tsv"), str(tmp_path / "l.tsv")
    assert write_graph(spec, e, lab, chunk=700) == 5000
    el = read_edges(e, self_loops="error")          # no self-loops were written
    assert len(el) == 5000
    labels = np.loadtxt(lab, dtype=np.int64)
    assert labels.shape == (500, 2) and labels[:, 1].max() < 5
    same = np.mean(labels[el.src, 1] == labels[el.dst, 1])
    assert same > 0.85                               # planted: most edges stay inside
    npy = str(tmp_path / "g.npy")
    write_graph(spec, npy, chunk=700)
    np.testing.assert_array_equal(np.load(npy)[:, 0], el.src)
    deg = np.bincount(el.src, minlength=500) + np.bincount(el.dst, minlength=500)
    assert deg.max() > 8 * np.median(deg)            # heavy-tailed degrees
    with pytest.raises(OutcoreError):
        PlantedGraph(GraphSpec(10, 10, communities=20))


def test_cli_trains_writes_and_evaluates(tmp_path, capsys):
    spec = GraphSpec(400, 6000, communities=4, mixing=0.05, seed=2)
    e, lab = str(tmp_path / "g.tsv"), str(tmp_path / "l.tsv")
    write_graph(spec, e, lab)
    out = str(tmp_path / "emb.safetensors")
    args = _parser().parse_args(["embed", e, "--dim", "8", "--epochs", "3", "--out", out,
                                 "--devices", "cpu", "--batch-size", "1024", "--no-progress",
                                 "--holdout", "0.05", "--partitions", "2"])
    assert args.func is run and run(args) == 0
    text = capsys.readouterr().out
    assert "M edges/s" in text and "link prediction on" in text
    args = _parser().parse_args(["embed", "eval", "--embeddings", out, "--edges", e,
                                 "--labels", lab, "--json", "--eval-negatives", "50"])
    assert run(args) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["node_classification"]["micro_f1"] >= 0.9
    assert 0 < m["link_prediction"]["mrr"] <= 1


def test_cli_string_ids_and_errors(tmp_path, capsys):
    e = tmp_path / "s.tsv"
    e.write_text("a\tb\nb\tc\nc\td\nd\ta\n")
    out = str(tmp_path / "emb.npy")
    args = _parser().parse_args(["embed", str(e), "--dim", "4", "--epochs", "1", "--out", out,
                                 "--devices", "cpu", "--no-progress"])
    run(args)
    assert np.load(out).shape == (4, 4)
    assert open(out + ".ids.tsv").read().splitlines()[2] == "2\tc"
    with pytest.raises(OutcoreError, match="--out is required"):
        run(_parser().parse_args(["embed", str(e)]))
    with pytest.raises(OutcoreError, match="needs --embeddings"):
        run(_parser().parse_args(["embed", "eval"]))
    with pytest.raises(OutcoreError, match="does not parse as a size"):
        run(_parser().parse_args(["embed", str(e), "--out", out, "--gpu-memory", "lots"]))
