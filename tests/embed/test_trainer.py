"""Training: partitioned (with swaps) equals a plain in-memory replay; embeddings separate
planted communities; several processes through torch.distributed."""

import numpy as np
import pytest
import torch

from outcore.embed import EmbedConfig, EmbeddingTrainer, GraphSpec, generate, node_classification
from outcore.embed.plan import make_plan
from outcore.embed.step import LossSpec, batch_grads
from outcore.embed.table import hash_init
from outcore.errors import OutcoreError


def _replay(records, cfg, N, P):
    """Plain dense PyTorch: the same steps on one N x W table in memory."""
    d, sides = cfg.dim, cfg.sides
    W = d * sides
    T = hash_init(torch.arange(N), W, cfg.seed, cfg.init_scale)
    k = 1 if cfg.optimizer == "adagrad" else 2 * d + 1
    S = torch.zeros(N, sides * k)
    spec = LossSpec(cfg.score, cfg.loss, cfg.margin, cfg.chunk_size, cfg.batch_negatives)
    M = cfg.num_negatives
    b1, b2 = cfg.betas
    for a, b, u, v, nu, nv in records:
        gu, gv, gnu, gnv = u * P + a, v * P + b, nu * P + a, nv * P + b
        tc = (sides - 1) * d
        U, V = T[gu, :d], T[gv, tc:tc + d]
        NU, NV = T[gnu, :d].view(-1, M, d), T[gnv, tc:tc + d].view(-1, M, d)
        _, dU, dV, dNU, dNV = batch_grads(U, V, NU, NV, spec)
        groups = [(0, torch.cat([gu, gnu]), torch.cat([dU, dNU.reshape(-1, d)])),
                  (sides - 1, torch.cat([gv, gnv]), torch.cat([dV, dNV.reshape(-1, d)]))]
        if sides == 1:
            groups = [(0, torch.cat([groups[0][1], groups[1][1]]),
                       torch.cat([groups[0][2], groups[1][2]]))]
        for side, ids, g in groups:
            G = torch.zeros(N, d).index_add_(0, ids, g)
            cols = slice(side * d, side * d + d)
            st = S[:, side * k:(side + 1) * k]
            if cfg.optimizer == "adagrad":
                if cfg.exact_sparse:
                    st[:, 0] += G.pow(2).mean(1)
                else:   # each occurrence's squared gradient, the summed step
                    st[:, 0] += torch.zeros(N).index_add_(0, ids, g.pow(2).mean(1))
                T[:, cols] -= cfg.lr * G / (st[:, 0].sqrt() + cfg.eps)[:, None]
            else:
                hit = torch.zeros(N, dtype=torch.bool)
                hit[ids] = True
                m = st[hit, :d] * b1 + (1 - b1) * G[hit]
                vv = st[hit, d:2 * d] * b2 + (1 - b2) * G[hit] ** 2
                t = st[hit, 2 * d] + 1
                step = cfg.lr * (1 - b2 ** t).sqrt() / (1 - b1 ** t)
                T[hit, cols] -= step[:, None] * m / (vv.sqrt() + cfg.eps)
                st[hit] = torch.cat([m, vv, t[:, None]], 1)
    return T


@pytest.mark.parametrize("directed,optimizer,exact", [(False, "adagrad", False),
                                                      (True, "adagrad", False),
                                                      (False, "adagrad", True),
                                                      (False, "adam", True)])
def test_partitioned_training_matches_in_memory_replay(directed, optimizer, exact):
    rng = np.random.default_rng(0)
    N, E, P = 61, 500, 4
    src, dst = rng.integers(0, N, E), rng.integers(0, N, E)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    cfg = EmbedConfig(dim=4, epochs=2, batch_size=48, chunk_size=8, num_negatives=3,
                      partitions=P, devices=["cpu"], progress=False, directed=directed,
                      optimizer=optimizer, lr=0.05, init_scale=0.5, seed=5, edge_chunk=40,
                      exact_sparse=exact)
    # a device budget for exactly 2 resident partitions: every epoch swaps partitions
    probe = make_plan(cfg, N, 1, 1 << 40, len(src))
    cfg.gpu_memory = probe.workspace_bytes + 2 * probe.partition_bytes + 8
    trainer = EmbeddingTrainer(cfg)
    records = []
    trainer.record = lambda *r: records.append([x.clone() if torch.is_tensor(x) else x for x in r])
    trainer.fit((src, dst), num_nodes=N)
    assert trainer.plan.capacity == 2
    assert trainer.summary_io["bytes_in"] > trainer.table.nbytes      # partitions came back
    assert trainer.summary["positives_trained"] == 2 * len(src)
    got = trainer.table.gather(np.arange(N))
    want = _replay(records, cfg, N, P)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_embeddings_separate_planted_communities():
    src, dst, labels = generate(GraphSpec(1200, 24000, communities=6, mixing=0.1, seed=3))
    tr = EmbeddingTrainer(EmbedConfig(dim=16, epochs=4, batch_size=2048, devices=["cpu"],
                                      progress=False, partitions=2))
    tr.fit((src, dst), num_nodes=1200)
    m = node_classification(tr.embeddings().numpy(), labels)
    assert m["micro_f1"] >= 0.9 and m["macro_f1"] >= 0.9


@pytest.mark.parametrize("mode", ["deepwalk", "node2vec"])
def test_random_walk_modes_separate_communities(mode):
    src, dst, labels = generate(GraphSpec(600, 6000, communities=4, mixing=0.05, seed=4))
    tr = EmbeddingTrainer(EmbedConfig(dim=16, epochs=3, batch_size=4096, devices=["cpu"],
                                      progress=False, mode=mode, walk_length=10, window=2,
                                      p=0.5, q=2.0))
    tr.fit((src, dst), num_nodes=600)
    assert tr.summary["positives_trained"] > 3 * len(src)      # walks yield many pairs
    assert node_classification(tr.embeddings().numpy(), labels)["micro_f1"] >= 0.9


def test_two_processes_through_torch_distributed():
    src, dst, labels = generate(GraphSpec(800, 12000, communities=4, mixing=0.1, seed=6))
    tr = EmbeddingTrainer(EmbedConfig(dim=16, epochs=3, batch_size=1024, partitions=4,
                                      devices=["cpu", "cpu"], progress=False))
    try:
        tr.fit((src, dst), num_nodes=800)
        stats = tr.rank_stats
        assert len(stats) == 2 and all(s["edges"] > 0 for s in stats)
        assert sum(s["edges"] for s in stats) == 3 * len(src)
        assert node_classification(tr.embeddings().numpy(), labels)["micro_f1"] >= 0.9
    finally:
        tr.close()


def test_bad_configuration_is_refused_in_one_line():
    with pytest.raises(OutcoreError, match="dim=0 must be a positive integer"):
        EmbeddingTrainer(EmbedConfig(dim=0))
    with pytest.raises(OutcoreError, match="loss='hinge' is not one of"):
        EmbeddingTrainer(loss="hinge")
    tr = EmbeddingTrainer(EmbedConfig(devices=["cpu"], gpu_memory=1000, progress=False))
    with pytest.raises(OutcoreError, match="holds no bucket"):
        tr.fit((np.array([0, 1]), np.array([1, 2])))
    with pytest.raises(TypeError):
        EmbeddingTrainer(progress=False).fit("edges.tsv")
    with pytest.raises(OutcoreError, match="need at least 4 partitions"):
        EmbeddingTrainer(EmbedConfig(devices=["cpu", "cpu"], partitions=2, progress=False)).fit(
            (np.array([0, 1, 2, 3]), np.array([1, 2, 3, 0])))


def _torchrun_rank(rank, port, path, out):
    import os
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    src, dst, labels = generate(GraphSpec(600, 8000, communities=4, mixing=0.1, seed=8))
    tr = EmbeddingTrainer(EmbedConfig(dim=16, epochs=2, batch_size=1024, partitions=4,
                                      devices=["cpu"], progress=False, table_path=path))
    tr.fit((src, dst), num_nodes=600)
    if tr.rank == 0:
        np.save(out, tr.embeddings().numpy())
        np.save(out + ".edges.npy", np.array([s["edges"] for s in tr.rank_stats]))


def test_ranks_started_like_torchrun_share_one_table(tmp_path):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "emb.npy")
    mp.spawn(_torchrun_rank, args=(port, str(tmp_path / "table.bin"), out), nprocs=2)
    per_rank = np.load(out + ".edges.npy")
    assert len(per_rank) == 2 and per_rank.min() > 0 and per_rank.sum() == 2 * 8000
    _, _, labels = generate(GraphSpec(600, 8000, communities=4, mixing=0.1, seed=8))
    assert node_classification(np.load(out), labels)["micro_f1"] >= 0.9
