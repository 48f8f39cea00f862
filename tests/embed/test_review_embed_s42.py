"""Review of node-embedding training (session 42): steps without negatives, walk and
holdout corners, hand-built edge lists, the table file, the planner's workspace, narrow
ids, the scheduler at many partitions, and a second fit."""

import argparse
import os
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from outcore.embed import EdgeList, EmbedConfig, EmbeddingTable, EmbeddingTrainer
from outcore.embed.cli import register, run
from outcore.embed.buckets import BucketedEdges, BucketScheduler, snake_units
from outcore.embed.device import PartitionCache
from outcore.embed.plan import epoch_positives, make_plan, workspace_bytes
from outcore.embed.sampling import EpochSource
from outcore.embed.step import LossSpec, batch_grads
from outcore.embed.table import HASH_BYTES, INIT_ELEMS, hash_init
from outcore.errors import OutcoreError
from outcore.transfer import Lanes


def _embed(*argv):
    p = argparse.ArgumentParser(prog="outcore")
    register(p.add_subparsers(dest="command"))
    return run(p.parse_args(["embed", *argv]))


def _cfg(**kw):
    return EmbedConfig(**{"dim": 4, "epochs": 1, "devices": ["cpu"], "progress": False, **kw})


@pytest.mark.parametrize("score,loss", [("dot", "logistic"), ("dot", "ranking"),
                                        ("cosine", "softmax"), ("cosine", "logistic")])
def test_no_sampled_negatives_train_every_loss(score, loss):
    # num_negatives=0 is accepted (the chunk's other positives are the negatives), but the
    # autograd losses failed on the unused empty negatives tensor: a RuntimeError traceback
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 40, 201), rng.integers(0, 40, 201)   # last step: 1 edge
    tr = EmbeddingTrainer(_cfg(score=score, loss=loss, num_negatives=0, batch_size=50,
                               chunk_size=8))
    tr.fit((src, dst), num_nodes=40)
    assert tr.summary["positives_trained"] == 201
    assert torch.isfinite(tr.embeddings()).all()


def test_a_lone_positive_keeps_its_logistic_term():
    # a one-edge chunk with no sampled negatives has no score block: the logistic loss
    # dropped the positive's own softplus(-pos) term (and autograd then failed)
    torch.manual_seed(0)
    U, V = torch.randn(1, 3), torch.randn(1, 3)
    none = torch.zeros(1, 0, 3)
    loss, dU, dV, dNU, dNV = batch_grads(U, V, none, none, LossSpec(loss="logistic"))
    Ur, Vr = U.clone().requires_grad_(), V.clone().requires_grad_()
    want = 2 * F.softplus(-(Ur * Vr).sum())          # both corruptions score the positive
    want.backward()
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(dU, Ur.grad)
    torch.testing.assert_close(dV, Vr.grad)
    assert dNU.shape == (1, 0, 3)
    # softmax and ranking have nothing to push against: zero loss, zero gradients
    for kind in ("ranking", "softmax"):
        out = batch_grads(U, V, none, none, LossSpec(loss=kind, score="cosine"))
        assert out[0] == 0 and out[1].abs().sum() == 0


def test_settings_that_train_on_nothing_are_refused():
    with pytest.raises(OutcoreError, match="walk_length=1 gives deepwalk no pairs"):
        EmbedConfig(mode="deepwalk", walk_length=1).validate()
    with pytest.raises(OutcoreError, match="walk_length=1 gives node2vec no pairs"):
        EmbeddingTrainer(_cfg(mode="node2vec", walk_length=1, p=0.5))
    EmbedConfig(walk_length=1).validate()                  # edges mode takes no walks
    EmbedConfig(mode="deepwalk", walk_length=2).validate()
    with pytest.raises(OutcoreError, match="no negatives"):
        EmbedConfig(num_negatives=0, chunk_size=1).validate()


def test_hand_built_edge_lists_get_one_line_errors():
    tr = EmbeddingTrainer(_cfg(partitions=2))
    for el, why in [
        (EdgeList(np.array([], np.int64), np.array([], np.int64), 5), "no edges to train on"),
        (EdgeList(np.array([0, 5]), np.array([1, 2]), 3), r"node ids must lie in 0\.\.2"),
        (EdgeList(np.array([0.0, 1.0]), np.array([1.0, 2.0]), 3), "integer node ids"),
        (EdgeList(np.array([0, 1]), np.array([1, 2]), 3, weight=np.zeros(2, np.float32)),
         "weights"),
        (EdgeList(np.array([0, 1]), np.array([1, 2]), 3,
                  weight=np.array([np.nan, 1], np.float32)), "weights"),
        (EdgeList(np.array([0, 1]), np.array([1, 2]), 3, weight=np.ones(3)), "weights"),
    ]:
        with pytest.raises(OutcoreError, match=why):
            tr.fit(el)


def test_holdout_that_leaves_nothing_to_train_on(tmp_path, capsys):
    path = tmp_path / "g.tsv"
    path.write_text("0 1\n1 2\n")
    out = str(tmp_path / "e.npy")
    with pytest.raises(OutcoreError, match=r"--holdout 0\.99 holds out all 2 edges"):
        _embed(str(path), "--out", out, "--holdout", "0.99", "--devices", "cpu",
               "--no-progress", "--dim", "4", "--epochs", "1")
    assert not os.path.exists(out)
    _embed(str(path), "--out", out, "--holdout", "0.01", "--devices", "cpu",
           "--no-progress", "--dim", "4", "--epochs", "1")
    assert "held out none of the 2 edges" in capsys.readouterr().out


def test_table_path_never_overwrites_a_file_that_is_no_table(tmp_path):
    edges = tmp_path / "edges.tsv"
    edges.write_text("0\t1\n1\t2\n")
    src, dst = np.array([0, 1]), np.array([1, 2])
    # --table-path pointing at the edge list (or the embeddings) truncated it silently
    with pytest.raises(OutcoreError, match="already exists and is not a table"):
        EmbeddingTrainer(_cfg(table_path=str(edges))).fit((src, dst))
    assert edges.read_text() == "0\t1\n1\t2\n"
    # an earlier table at that path (PATH.init beside it) is replaced, whatever its shape
    table = str(tmp_path / "t.bin")
    EmbeddingTrainer(_cfg(table_path=table, partitions=2)).fit((src, dst))
    tr = EmbeddingTrainer(_cfg(table_path=table, dim=8, partitions=3))
    tr.fit((np.arange(5), np.arange(1, 6)))
    assert os.path.getsize(table) == tr.table.nbytes and tr.table.P == 3
    open(tmp_path / "empty.bin", "w").close()              # an empty file holds nothing
    EmbeddingTrainer(_cfg(table_path=str(tmp_path / "empty.bin"))).fit((src, dst))


def test_table_file_on_a_full_disk_is_refused_before_training(tmp_path, monkeypatch):
    # the file starts sparse: without the check the first write past the free space kills
    # the process with SIGBUS in the middle of training
    real = os.statvfs

    class Full:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 1
    monkeypatch.setattr(os, "statvfs", lambda p: Full(real(p)))
    with pytest.raises(OutcoreError, match="needs .* GiB but its filesystem has"):
        EmbeddingTable(1000, 64, path=str(tmp_path / "t.bin"))
    assert not os.path.exists(tmp_path / "t.bin")


def test_planner_counts_the_walk_pairs_and_the_first_rows_hash():
    rng = np.random.default_rng(2)
    N, E = 300, 600
    src, dst = rng.integers(0, N, E), rng.integers(0, N, E)
    cfg = _cfg(mode="deepwalk", walk_length=12, window=3, walks_per_node=2, partitions=1,
               batch_size=256).validate()
    # an epoch of walks holds many times the edges: the edge buffers the worker sizes by
    # the largest bucket were planned from the edge count
    biggest = int(np.diff(EpochSource(src, dst, N, None, cfg, 1).epoch(0).offsets).max())
    assert biggest > 4 * E and epoch_positives(cfg, N, E) >= biggest
    walk = make_plan(cfg, N, 1, 1 << 40, epoch_positives(cfg, N, E))
    edges = make_plan(cfg, N, 1, 1 << 40, E)
    assert walk.workspace_bytes - edges.workspace_bytes >= (biggest - E) * 40
    assert edges.workspace_bytes >= INIT_ELEMS * HASH_BYTES


def test_first_fetch_hashes_rows_in_bounded_pieces(monkeypatch):
    # 1M rows hashed at once peaked at ~40 bytes a value (10 GiB at width 256), none of
    # it in the planned workspace
    t = EmbeddingTable(10000, 512, partitions=1, seed=3)
    assert t.init_chunk * t.width <= INIT_ELEMS < 10000 * t.width
    sizes, real = [], t.initial_rows
    monkeypatch.setattr(t, "initial_rows",
                        lambda p, dev, a, b: sizes.append(b - a) or real(p, dev, a, b))
    cache = PartitionCache(t, torch.device("cpu"), Lanes(torch.device("cpu")), 1, pin=False)
    cache.fetch(0, {0})
    assert sum(sizes) == 10000 and max(sizes) <= t.init_chunk
    rows = cache.view(0)[0][:10000]
    torch.testing.assert_close(rows, hash_init(torch.arange(10000), 512, 3, t.init_scale))


def test_narrow_integer_ids_bucket_like_wide_ones():
    # int16 ids with 200 partitions: the bucket key pa * P + pb overflowed int16
    rng = np.random.default_rng(3)
    src = rng.integers(0, 30000, 4000).astype(np.int16)
    dst = rng.integers(0, 30000, 4000).astype(np.int16)
    for directed in (False, True):
        narrow = BucketedEdges.build(src, dst, 200, directed, shuffle=False)
        wide = BucketedEdges.build(src.astype(np.int64), dst.astype(np.int64), 200, directed,
                                   shuffle=False)
        assert np.array_equal(narrow.offsets, wide.offsets)
        assert np.array_equal(narrow.src, wide.src) and np.array_equal(narrow.dst, wide.dst)


def _scan_acquire(s, remaining, worker, held):
    """The scheduler's choice by scanning every remaining unit (its earlier code)."""
    best, best_score = None, -1
    for u in remaining:
        if any(s.owner.get(p, worker) != worker for p in u):
            continue
        score = len(set(u) & set(held))
        if score > best_score:
            best, best_score = u, score
            if score == len(set(u)):
                break
    return best


def test_scheduler_at_many_partitions_chooses_as_before_and_fast():
    rng = np.random.default_rng(4)
    for P, W in [(5, 1), (8, 3), (13, 2)]:
        s = BucketScheduler(P, skip_empty=snake_units(P)[::7])
        remaining = [u for u in snake_units(P) if u not in s.skip]
        holding = {w: [] for w in range(W)}
        for _ in range(2000):
            w = int(rng.integers(W))
            if holding[w] and rng.random() < 0.5:
                u = holding[w].pop(0)
                keep = {p for v in holding[w] for p in v}
                s.release(w, [p for p in u if p not in keep])
            elif len(holding[w]) < 2:
                held = tuple(p for v in holding[w] for p in v) + tuple(
                    rng.choice(P, int(rng.integers(0, 3))))
                want = _scan_acquire(s, remaining, w, held)
                got = s.acquire(w, held)
                assert got == (want if remaining else None) or (want is None and got == "wait")
                if want is not None:
                    remaining.remove(want)
                    holding[w].append(want)
    # a streamed epoch of P=128 (8256 units, 3 partitions held): 19 s before, O(P**4)
    s, held, t0 = BucketScheduler(128), (), time.perf_counter()
    while (u := s.acquire(0, held)) is not None:
        s.release(0, u)
        held = tuple(dict.fromkeys(u + held))[:3]
    assert time.perf_counter() - t0 < 3.0


def test_a_second_fit_sizes_its_own_batches():
    tr = EmbeddingTrainer(_cfg())
    tr.fit((np.array([0, 1]), np.array([1, 2])))
    assert tr.cfg.batch_size == 4096
    rng = np.random.default_rng(5)
    tr.fit((rng.integers(0, 50, 640_000), rng.integers(0, 50, 640_000)), num_nodes=50)
    assert tr.cfg.batch_size == 10_000                       # E / 64, not the first graph's
    fixed = EmbeddingTrainer(_cfg(batch_size=7))
    fixed.fit((np.array([0, 1]), np.array([1, 2])))
    assert fixed.cfg.batch_size == 7
    fixed.cfg.batch_size = 9                                 # set between fits: kept
    fixed.fit((np.array([0, 1]), np.array([1, 2])))
    assert fixed.cfg.batch_size == 9


def test_planned_workspace_holds_adams_coalesced_update():
    # Adam (and exact Adagrad) gather a bucket (i, i)'s 2 (B + K*M) rows with their state
    # at once: measured on the CPU at 1.4-1.6x the planned step temporaries
    base = dict(dim=128, batch_size=1 << 15, chunk_size=64, num_negatives=64)
    kinds = {"adagrad": {}, "adam": dict(optimizer="adam"), "exact": dict(exact_sparse=True)}
    ws = {k: workspace_bytes(EmbedConfig(**base, **kw).validate(), 1) for k, kw in kinds.items()}
    n, d = 2 * ((1 << 15) + 512 * 64), 128
    assert ws["adam"] - ws["adagrad"] >= n * (2 * d + 1) * 4 * 3     # state gather, m|v|t, cat
    assert ws["exact"] - ws["adagrad"] >= n * d * 4 * 3              # sorted grads, sums


def test_config_integers_may_be_numpy_and_must_be_integers():
    cfg = EmbedConfig(dim=np.int64(8), partitions=np.int32(3)).validate()
    assert type(cfg.dim) is int and type(cfg.partitions) is int
    for bad in (2.5, "4", True, 0):
        with pytest.raises(OutcoreError, match="partitions=.* must be an integer >= 1"):
            EmbedConfig(partitions=bad).validate()
    with pytest.raises(OutcoreError, match="storage='ram' keeps no table file"):
        EmbedConfig(storage="ram", table_path="t.bin").validate()


def test_walk_pairs_are_mixed_across_their_distances():
    # walk_pairs lists every k=1 pair, then every k=2 pair...; the worker permutes only
    # within an edge_chunk, so a bucket longer than that trained them grouped by distance.
    # On a directed cycle a pair's distance is (dst - src) mod N.
    N = 20000
    src = np.arange(N)
    cfg = _cfg(mode="deepwalk", walk_length=6, window=3, partitions=1,
               directed=True).validate()
    ep = EpochSource(src, (src + 1) % N, N, None, cfg, 1).epoch(0)
    k = (ep.dst.astype(np.int64) - ep.src) % N
    assert len(k) == N * (5 + 4 + 3)
    first = k[:len(k) // 2]
    assert (first == 3).mean() > 0.15 and (first == 1).mean() < 0.6


def test_a_budget_barely_above_the_workspace_is_refused_not_planned_into_a_hang():
    # 97 KiB beside the workspace for a 34 MiB table: the planner doubled P to 2048, 2.1M
    # buckets an epoch of partitions of a few hundred rows (the scheduler alone: hours)
    cfg = EmbedConfig(dim=8, batch_size=4096).validate()
    ws = make_plan(cfg, 10**6, 1, 1 << 50, 10**6).workspace_bytes
    assert make_plan(cfg, 10**6, 1, ws + 10**6, 10**6).partitions == 128
    with pytest.raises(OutcoreError, match=r"would need 2,048 partitions.*raise --gpu-memory"):
        make_plan(cfg, 10**6, 1, ws + 10**5, 10**6)
    cfg.partitions = 2048                                   # asked for: planned as asked
    assert make_plan(cfg, 10**6, 1, ws + 10**5, 10**6).partitions == 2048


def test_a_second_fit_removes_the_first_fits_temporary_table(tmp_path):
    # a table too big for half the RAM (or shared by processes) goes to a temporary file,
    # which close() removes; a second fit replaced the table and left the first file behind
    tr = EmbeddingTrainer(_cfg())
    paths = iter([str(tmp_path / "a.bin"), str(tmp_path / "b.bin")])
    tr._storage_path = lambda nbytes, shared: next(paths)
    tr.fit((np.array([0, 1]), np.array([1, 2])))
    assert os.path.exists(tmp_path / "a.bin")
    tr.fit((np.array([0, 1]), np.array([1, 2])))
    assert not os.path.exists(tmp_path / "a.bin") and os.path.exists(tmp_path / "b.bin")
    tr.close()
    assert sorted(os.listdir(tmp_path)) == []


def test_too_few_nodes_for_the_workers_names_the_real_limit():
    # "raise --partitions" could not help: partitions are capped at the node count
    tr = EmbeddingTrainer(_cfg(devices=["cpu", "cpu"], partitions=8))
    with pytest.raises(OutcoreError, match="the graph has 3 nodes: use fewer devices"):
        tr.fit((np.array([0, 1]), np.array([1, 2])))
