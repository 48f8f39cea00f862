"""Helpers for the gemm tests: matrices in many layouts with known float64 values."""

from __future__ import annotations

import numpy as np
import torch

NP = {"float32": np.float32, "float64": np.float64}
TORCH = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
# error allowed, relative to alpha*|op(A)| @ |op(B)| + |beta * C0| (elementwise)
TOL = {"fp64": 1e-12, "fp32": 2e-5, "tf32": 2e-5, "tf32x3": 2e-5, "bf16": 1e-2}


def rounded(vals: np.ndarray, dtype: str) -> np.ndarray:
    """vals as the dtype stores them, back in float64."""
    return torch.from_numpy(vals).to(TORCH[dtype]).to(torch.float64).numpy()


def make(vals: np.ndarray, kind: str, dtype: str, layout: str):
    """A host matrix holding `vals` (rounded to dtype) with the given memory layout.

    layout: "c" row-major, "f" column-major, "step" every other column of a wider
    matrix (no unit stride), "neg" numpy with negative strides (numpy only).
    """
    r, c = vals.shape
    if kind == "numpy":
        v = vals.astype(NP[dtype])
        if layout == "f":
            return np.asfortranarray(v)
        if layout == "step":
            wide = np.zeros((r, 2 * c + 1), dtype=v.dtype)
            wide[:, 1::2] = v
            return wide[:, 1::2]
        if layout == "neg":
            return np.ascontiguousarray(v[::-1, ::-1])[::-1, ::-1]
        return np.ascontiguousarray(v)
    t = torch.from_numpy(vals).to(TORCH[dtype]).clone()  # never share memory with vals
    if layout == "f":
        return t.t().contiguous().t()
    if layout == "step":
        wide = torch.zeros(r, 2 * c + 1, dtype=t.dtype)
        wide[:, 1::2] = t
        return wide[:, 1::2]
    return t.contiguous()


def as64(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return np.asarray(x, dtype=np.float64)
    return x.to(torch.float64).numpy()


def check_close(got, a64, b64, c0, alpha, beta, compute, transa=False, transb=False):
    """Assert got == alpha op(A) op(B) + beta C0 within the compute's tolerance."""
    oa = a64.T if transa else a64
    ob = b64.T if transb else b64
    ref = alpha * (oa @ ob)
    scale = abs(alpha) * (np.abs(oa) @ np.abs(ob))
    if beta != 0:
        ref = ref + beta * c0
        scale = scale + abs(beta) * np.abs(c0)
    err = np.abs(as64(got) - ref)
    bound = TOL[compute] * scale + 1e-30
    worst = float((err - bound).max()) if err.size else 0.0
    assert worst <= 0, f"error {err.max():.3g} above tolerance ({compute})"


def fake_stats(reserved: int, allocated: int) -> dict:
    """The part of torch.cuda.memory.memory_stats_as_nested_dict that
    outcore.memory.cached_unused_bytes reads (CPU tests fake the allocator with it)."""
    return {"reserved_bytes": {"all": {"current": reserved}},
            "allocated_bytes": {"all": {"current": allocated}}}


def one_line(excinfo) -> str:
    """The message of a pytest.raises excinfo, asserted to be one short line."""
    msg = str(excinfo.value)
    assert "\n" not in msg and len(msg) < 300
    return msg
