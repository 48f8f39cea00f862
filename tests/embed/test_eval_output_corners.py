"""`embed eval` and the output files at their corners: a tiny graph ranked sanely, negative
counts and devices checked, and no stale id mapping left beside new embeddings."""

import argparse
import json
import os

import numpy as np
import pytest
import torch

from outcore.embed.cli import register, run
from outcore.embed.evaluate import evaluate_link_prediction
from outcore.embed.output import save_embeddings
from outcore.embed.table import EmbeddingTable
from outcore.errors import OutcoreError


def _cli(*argv):
    p = argparse.ArgumentParser(prog="outcore")
    register(p.add_subparsers(dest="command"))
    return run(p.parse_args(["embed", *argv]))


def _cycle(N=6):
    """A directed N-cycle and embeddings that score each edge's ends highest of all."""
    src, dst = np.arange(N), (np.arange(N) + 1) % N
    emb = np.concatenate([np.eye(N), np.roll(np.eye(N), 1, axis=0)], 1).astype(np.float32)
    return emb, src, dst


def test_perfect_embeddings_of_a_tiny_graph_score_one():
    """1000 uniform draws from 6 nodes held each edge's own target ~170 times, each a tie
    counted against it: MRR 0.006 for embeddings that rank every edge first."""
    emb, src, dst = _cycle()
    m = evaluate_link_prediction(emb, src, dst, directed=True)
    assert m["mrr"] == 1.0 and m["hits1"] == 1.0 and m["mean_rank"] == 1.0


def test_a_graph_smaller_than_the_negatives_is_ranked_against_every_node_once():
    rng = np.random.default_rng(0)
    N = 12
    emb = rng.standard_normal((N, 3)).astype(np.float32)
    src, dst = rng.integers(0, N, 20), rng.integers(0, N, 20)
    m = evaluate_link_prediction(emb, src, dst, batch_negs=7, uniform_negs=50)
    ranks = []
    for s, t in zip(src, dst):
        pos = emb[s] @ emb[t]
        for anchor, true in ((emb[s], t), (emb[t], s)):
            ranks.append(1 + sum(anchor @ emb[v] >= pos for v in range(N) if v != true))
    r = np.array(ranks, dtype=float)
    assert r.max() <= N
    assert m["mean_rank"] <= N
    assert abs(m["mrr"] - np.mean(1 / r)) < 1e-6 and abs(m["mean_rank"] - r.mean()) < 1e-6


def test_negative_counts_and_devices_are_checked(tmp_path):
    emb, src, dst = _cycle()
    for kw in (dict(batch_negs=0), dict(uniform_negs=-1), dict(batch_negs=-3)):
        with pytest.raises(OutcoreError, match="negs=.*must be"):
            evaluate_link_prediction(emb, src, dst, directed=True, **kw)
    path = str(tmp_path / "e.npy")
    np.save(path, emb)
    edges = tmp_path / "t.tsv"
    edges.write_text("0\t1\n1\t2\n")
    for n in ("0", "-5"):
        with pytest.raises(OutcoreError, match="--eval-negatives"):
            _cli("eval", "--embeddings", path, "--edges", str(edges), "--eval-negatives", n)
    with pytest.raises(OutcoreError, match="'meta' is not supported"):
        _cli("eval", "--embeddings", path, "--edges", str(edges), "--device", "meta")


def test_integer_id_embeddings_remove_a_stale_id_mapping(tmp_path, capsys):
    """A string-id run then an integer-id run to the same --out: the old OUT.ids.tsv stayed,
    and eval mapped the new run's integer ids through the old names."""
    path = str(tmp_path / "emb.npy")
    save_embeddings(EmbeddingTable(4, 3, seed=1), path, names=["0", "3", "2", "1"])
    assert os.path.exists(path + ".ids.tsv")
    emb, src, dst = _cycle(4)
    t = EmbeddingTable(4, 8)
    t.load_(torch.from_numpy(emb))
    assert save_embeddings(t, path) == [path]
    assert sorted(os.listdir(tmp_path)) == ["emb.npy"]
    edges = tmp_path / "t.tsv"
    edges.write_text("".join(f"{s}\t{d}\n" for s, d in zip(src, dst)))
    assert _cli("eval", "--embeddings", path, "--edges", str(edges), "--directed",
                "--json") == 0
    assert json.loads(capsys.readouterr().out)["link_prediction"]["mrr"] == 1.0
