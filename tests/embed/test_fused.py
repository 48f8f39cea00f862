"""The fused Triton kernel against its plain-torch emulation (Triton's interpreter on the
CPU; the module is skipped where triton is not installed, the kernel being GPU code)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from outcore.embed import EmbedConfig, EmbeddingTrainer, GraphSpec, generate  # noqa: E402
from outcore.embed import node_classification  # noqa: E402
from outcore.embed.fused import emulate, fused_step  # noqa: E402

needs_interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and
                                  not torch.cuda.is_available(),
                                  reason="needs CUDA or TRITON_INTERPRET=1")


@needs_interp
@pytest.mark.parametrize("bneg,sides", [(True, 1), (False, 1), (True, 2)])
def test_kernel_matches_its_emulation(bneg, sides):
    torch.manual_seed(0)
    cfg = EmbedConfig(dim=16, chunk_size=16, num_negatives=16, batch_negatives=bneg,
                      lr=0.3, directed=sides == 2)
    n, B = 40, 37                                    # repeats, and a partial last chunk
    K = -(-B // 16)
    rows = torch.randn(n + 1, 16 * sides) * 0.5
    state = torch.rand(n + 1, sides)
    u, v = torch.randint(0, n, (B,)), torch.randint(0, n, (B,))
    nu, nv = torch.randint(0, n, (K * 16,)), torch.randint(0, n, (K * 16,))
    r1, s1 = rows.clone(), state.clone()
    loss = torch.zeros(1)
    fused_step(r1, s1, r1, s1, u, v, nu, nv, cfg, 0, sides - 1, loss)
    r2, s2 = rows.clone(), state.clone()
    want = emulate(r2, s2, r2, s2, u, v, nu, nv, cfg, 0, sides - 1)
    torch.testing.assert_close(r1, r2, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(loss[0], want, atol=1e-3, rtol=1e-5)


@needs_interp
@pytest.mark.parametrize("C,M,bneg", [(64, 16, True), (64, 16, False), (32, 32, True)])
def test_kernel_touches_only_its_rows(C, M, bneg):
    """Rows and state sit between NaN guard regions: the kernel must neither write the
    guards nor read them into its results. (64, 16, batch negatives) is the configuration
    that failed on the H200 with an illegal memory access; here it is clean, so that fault
    is in the compiled kernel, and check_fused refuses the configuration.)"""
    torch.manual_seed(1)
    d, n, B, G = 32, 300, 100, 64                    # B: a partial last chunk
    K = -(-B // C)
    cfg = EmbedConfig(dim=d, chunk_size=C, num_negatives=M, batch_negatives=False)
    cfg.batch_negatives = bneg                       # past check_fused: the kernel itself
    big = torch.full((n + 2 * G, d), float("nan"))
    sbig = torch.full((n + 2 * G, 1), float("nan"))
    rows, state = big[G:G + n], sbig[G:G + n]
    rows.copy_(torch.randn(n, d) * 0.3)
    state.copy_(torch.rand(n, 1))
    u, v = torch.randint(0, n, (B,), dtype=torch.int32), torch.randint(0, n, (B,))
    nu, nv = torch.randint(0, n, (K * M,)), torch.randint(0, n, (K * M,))
    loss = torch.zeros(1)
    fused_step(rows, state, rows, state, u, v, nu, nv, cfg, 0, 0, loss)
    for guard in (big[:G], big[G + n:], sbig[:G], sbig[G + n:]):
        assert guard.isnan().all()
    assert rows.isfinite().all() and state.isfinite().all() and loss.isfinite().all()


@needs_interp
def test_fused_training_separates_communities():
    src, dst, labels = generate(GraphSpec(300, 3000, communities=3, mixing=0.05, seed=11))
    tr = EmbeddingTrainer(EmbedConfig(dim=16, epochs=3, batch_size=512, chunk_size=16,
                                      num_negatives=16, devices=["cpu"], progress=False,
                                      kernel="fused", partitions=2))
    tr.fit((src, dst), num_nodes=300)
    assert tr.summary["loss_per_epoch"][-1] < tr.summary["loss_per_epoch"][0]
    assert node_classification(tr.embeddings().numpy(), labels)["micro_f1"] >= 0.9
