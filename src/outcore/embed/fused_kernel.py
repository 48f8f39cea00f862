"""The Triton kernel of kernel="fused" (see fused.py); imported only when it is used,
so that outcore works where triton is not installed."""

import triton
import triton.language as tl


@triton.jit
def _mm(a, b, LOWP: tl.constexpr):
    # LOWP: bf16 operands, fp32 accumulation (half the shared memory of fp32 operands)
    if LOWP:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return tl.dot(a, b)


@triton.jit
def _side(A, Bm, N, pos, cm, diag, BATCH_NEGS: tl.constexpr, LOWP: tl.constexpr):
    # anchor rows A against [Bm (batch negatives), N (sampled)]: loss, P blocks, w
    Ss = _mm(A, tl.trans(N), LOWP)
    m = tl.maximum(pos, tl.max(Ss, 1))
    if BATCH_NEGS:
        Sb = _mm(A, tl.trans(Bm), LOWP)
        Sb = tl.where(diag | (cm[None, :] == 0), float("-inf"), Sb)
        m = tl.maximum(m, tl.max(Sb, 1))
    e0 = tl.exp(pos - m)
    Es = tl.exp(Ss - m[:, None])
    tot = e0 + tl.sum(Es, 1)
    if BATCH_NEGS:
        Eb = tl.exp(Sb - m[:, None])
        tot += tl.sum(Eb, 1)
    else:
        Eb = Es
    inv = tl.where(cm, 1.0 / tot, 0.0)
    loss = tl.sum(tl.where(cm, m + tl.log(tot) - pos, 0.0), 0)
    w = tl.where(cm, e0 * inv - 1.0, 0.0)
    return loss, Eb * inv[:, None], Es * inv[:, None], w


@triton.jit
def _adagrad(R, S, idx, G, mask, cols, W, SW, col, scol, lr, eps, inv_d):
    g2 = tl.sum(G * G, 1) * inv_d
    old = tl.atomic_add(S + idx * SW + scol, g2, mask=mask)
    coef = lr / (tl.sqrt(old + g2) + eps)
    tl.atomic_add(R + idx[:, None] * W + col + cols[None, :], -coef[:, None] * G,
                  mask=mask[:, None])


@triton.jit
def kernel(Ra, Sa, Rb, Sb, u_ptr, v_ptr, nu_ptr, nv_ptr, loss_ptr, B, W, SW,
           a_col, b_col, a_scol, b_scol, lr, eps, inv_d,
           C: tl.constexpr, M: tl.constexpr, D: tl.constexpr, BATCH_NEGS: tl.constexpr,
           LOWP: tl.constexpr):
    k = tl.program_id(0)
    rc = k * C + tl.arange(0, C)
    cm = rc < B
    cols = tl.arange(0, D)
    rm = k * M + tl.arange(0, M)
    iu = tl.load(u_ptr + rc, mask=cm, other=0)
    iv = tl.load(v_ptr + rc, mask=cm, other=0)
    inu = tl.load(nu_ptr + rm)
    inv_ = tl.load(nv_ptr + rm)
    A = tl.load(Ra + iu[:, None] * W + a_col + cols[None, :], mask=cm[:, None], other=0.0)
    Bm = tl.load(Rb + iv[:, None] * W + b_col + cols[None, :], mask=cm[:, None], other=0.0)
    NU = tl.load(Ra + inu[:, None] * W + a_col + cols[None, :])
    NV = tl.load(Rb + inv_[:, None] * W + b_col + cols[None, :])
    pos = tl.sum(A * Bm, 1)
    ar = tl.arange(0, C)
    diag = ar[:, None] == ar[None, :]
    # target side corrupted: anchors A, negatives [Bm, NV]
    l1, Pb, Ps, w1 = _side(A, Bm, NV, pos, cm, diag, BATCH_NEGS, LOWP)
    dA = w1[:, None] * Bm + _mm(Ps, NV, LOWP)
    dB = w1[:, None] * A
    if BATCH_NEGS:
        dA += _mm(Pb, Bm, LOWP)
        dB += _mm(tl.trans(Pb), A, LOWP)
    dNV = _mm(tl.trans(Ps), A, LOWP)
    # source side corrupted: anchors Bm, negatives [A, NU]
    l2, Qb, Qs, w2 = _side(Bm, A, NU, pos, cm, diag, BATCH_NEGS, LOWP)
    dB += w2[:, None] * A + _mm(Qs, NU, LOWP)
    dA += w2[:, None] * Bm
    if BATCH_NEGS:
        dB += _mm(Qb, A, LOWP)
        dA += _mm(tl.trans(Qb), Bm, LOWP)
    dNU = _mm(tl.trans(Qs), Bm, LOWP)
    tl.atomic_add(loss_ptr, l1 + l2)
    allm = rm >= 0
    _adagrad(Ra, Sa, iu, dA, cm, cols, W, SW, a_col, a_scol, lr, eps, inv_d)
    _adagrad(Rb, Sb, iv, dB, cm, cols, W, SW, b_col, b_scol, lr, eps, inv_d)
    _adagrad(Ra, Sa, inu, dNU, allm, cols, W, SW, a_col, a_scol, lr, eps, inv_d)
    _adagrad(Rb, Sb, inv_, dNV, allm, cols, W, SW, b_col, b_scol, lr, eps, inv_d)
