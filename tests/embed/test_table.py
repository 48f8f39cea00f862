"""Host table layout, initialisation independent of P, memory-mapped storage, output files."""

import numpy as np
import pytest
import torch

from outcore.embed.output import load_embeddings, save_embeddings
from outcore.embed.table import EmbeddingTable, hash_init
from outcore.errors import OutcoreError


def test_partitions_stripe_nodes_and_state_sits_beside_rows():
    t = EmbeddingTable(10, 3, partitions=3, state_cols=2)
    assert t.sizes == [4, 3, 3]
    full = torch.arange(30, dtype=torch.float32).view(10, 3)
    t.load_(full)
    torch.testing.assert_close(t.rows(1), full[[1, 4, 7]])
    torch.testing.assert_close(t.gather(np.array([9, 0, 5])), full[[9, 0, 5]])
    t.state(2).fill_(-1.5)
    # partition 2's state follows its rows in the flat buffer and touches nothing else
    a = int(t.offsets[2])
    assert (t.flat[a + 9:a + 15] == -1.5).all() and (t.flat[a:a + 9] >= 0).all()
    torch.testing.assert_close(t.rows(2), full[[2, 5, 8]])


def test_initial_rows_do_not_depend_on_partitioning():
    a = EmbeddingTable(50, 4, partitions=1, init_scale=0.5, seed=3)
    b = EmbeddingTable(50, 4, partitions=7, init_scale=0.5, seed=3)
    ids = np.arange(50)
    torch.testing.assert_close(a.gather(ids), b.gather(ids))
    x = a.gather(ids)
    assert x.abs().max() <= 0.5 and x.std() > 0.2      # spread over [-0.5, 0.5)
    assert not torch.equal(hash_init(torch.arange(5), 4, 3, 1.0), hash_init(torch.arange(5), 4, 4, 1.0))


def test_memory_mapped_table_is_shared_between_openers(tmp_path):
    path = str(tmp_path / "t.bin")
    t = EmbeddingTable(20, 2, partitions=4, path=path)
    t.materialize(1)
    t.rows(1)[0] = torch.tensor([5.0, 6.0])
    t.flush()
    u = EmbeddingTable(20, 2, partitions=4, path=path, create=False)
    assert u.is_initialized(1) and not u.is_initialized(0)
    assert u.gather(np.array([1]))[0].tolist() == [5.0, 6.0]
    with pytest.raises(OutcoreError):
        EmbeddingTable(5, 2, partitions=9)


@pytest.mark.parametrize("fmt", ["npy", "safetensors", "tsv"])
def test_save_and_load_embeddings(tmp_path, fmt):
    t = EmbeddingTable(13, 3, partitions=2, seed=1)
    want = t.gather(np.arange(13)).numpy()
    path = str(tmp_path / f"e.{fmt}")
    files = save_embeddings(t, path, names=[f"n{i}" for i in range(13)], chunk=5)
    assert files == [path, path + ".ids.tsv"]
    got = load_embeddings(path)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert open(path + ".ids.tsv").readline() == "0\tn0\n"
    if fmt == "safetensors":
        from safetensors.numpy import load_file
        np.testing.assert_array_equal(load_file(path)["embeddings"], want)
    with pytest.raises(OutcoreError, match="cannot tell the format"):
        save_embeddings(t, str(tmp_path / "e.bin"))
