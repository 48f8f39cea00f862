"""Training: partitioned (with swaps) equals a plain in-memory replay; embeddings separate
planted communities; several processes through torch.distributed."""

import numpy as np
import pytest
import torch

from outcore.embed import EmbedConfig, EmbeddingTrainer, GraphSpec, generate, node_classification
from outcore.embed.plan import make_plan
from outcore.embed.reference import replay_dense
from outcore.errors import OutcoreError


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
    want = replay_dense([[x.cpu() if torch.is_tensor(x) else x for x in r] for r in records],
                        cfg, N, P)
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


def test_memory_mapped_table_trains_like_the_ram_table(tmp_path):
    src, dst, _ = generate(GraphSpec(300, 3000, communities=3, seed=9))
    kw = dict(dim=8, epochs=2, batch_size=512, partitions=3, devices=["cpu"], progress=False)
    ram = EmbeddingTrainer(EmbedConfig(**kw))
    ram.fit((src, dst), num_nodes=300)
    mm = EmbeddingTrainer(EmbedConfig(**kw, storage="mmap", table_path=str(tmp_path / "t.bin")))
    mm.fit((src, dst), num_nodes=300)
    assert mm.table.path is not None and ram.table.path is None
    torch.testing.assert_close(mm.embeddings(), ram.embeddings())


@pytest.mark.parametrize("score,loss", [("cosine", "logistic"), ("dot", "ranking")])
def test_other_scores_and_losses_train(score, loss):
    src, dst, labels = generate(GraphSpec(600, 9000, communities=3, mixing=0.05, seed=10))
    tr = EmbeddingTrainer(EmbedConfig(dim=16, epochs=3, batch_size=1024, devices=["cpu"],
                                      progress=False, score=score, loss=loss, lr=0.2))
    tr.fit((src, dst), num_nodes=600)
    losses = tr.summary["loss_per_epoch"]
    assert losses[-1] < losses[0]
    assert node_classification(tr.embeddings().numpy(), labels)["micro_f1"] >= 0.9


def test_fused_refuses_what_it_does_not_implement():
    with pytest.raises(OutcoreError, match="kernel='fused' cannot run"):
        EmbedConfig(kernel="fused", loss="logistic").validate()
    with pytest.raises(OutcoreError, match="power of two"):
        EmbedConfig(kernel="fused", dim=24).validate()
    with pytest.raises(OutcoreError, match="num_negatives must be >= chunk_size"):
        EmbedConfig(kernel="fused", chunk_size=64, num_negatives=16).validate()
    # the configurations measured on the GPU pass
    EmbedConfig(kernel="fused", chunk_size=64, num_negatives=64).validate()
    EmbedConfig(kernel="fused", chunk_size=64, num_negatives=16, batch_negatives=False).validate()
