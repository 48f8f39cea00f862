"""AdamW on flat host buffers, run by a worker thread while the device computes.

`outcore.AdamW` is the user-facing config (the arguments of torch.optim.AdamW). Each group
gets its own torch.optim.AdamW over one flat fp32 tensor: AdamW is elementwise, so this is
exactly torch's update of the separate parameters, in one fused call per group.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass

import torch

from ..errors import OutcoreError


@dataclass
class AdamW:
    """AdamW hyper-parameters, with torch.optim.AdamW's meaning and defaults."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self):
        if not (self.lr >= 0):
            raise OutcoreError(f"AdamW lr={self.lr} must be >= 0")
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise OutcoreError(f"AdamW betas={self.betas} must each be in [0, 1)")
        if not (self.eps > 0):
            raise OutcoreError(f"AdamW eps={self.eps} must be > 0")
        if self.weight_decay < 0:
            raise OutcoreError(f"AdamW weight_decay={self.weight_decay} must be >= 0")


def _fused_available() -> bool:
    try:
        p = torch.zeros(2, requires_grad=True)
        p.grad = torch.zeros(2)
        torch.optim.AdamW([p], fused=True).step()
        return True
    except (RuntimeError, TypeError):
        return False


class GroupOptimizers:
    """One torch AdamW per group, over the group's flat master buffer.

    master[g] (fp32, n_g) is wrapped as a leaf tensor whose .grad is set to the landing
    buffer of the step before `step(g)`. m and v (2 x 4 bytes/param) are torch's state.
    """

    def __init__(self, masters: list[torch.Tensor], cfg: AdamW):
        self.cfg = cfg
        fused = _fused_available()
        self.leaves = [torch.nn.Parameter(m, requires_grad=True) for m in masters]
        kw = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
        self.opts = [torch.optim.AdamW([leaf], **kw, **({"fused": True} if fused else {}))
                     for leaf in self.leaves]
        self.fused = fused

    def set_lr(self, lr: float) -> None:
        for o in self.opts:
            for pg in o.param_groups:
                pg["lr"] = lr

    def step(self, g: int, grad: torch.Tensor, scale: float = 1.0) -> None:
        """Update group g with `grad` (fp32, flat; multiplied by `scale` first if != 1)."""
        if g >= len(self.opts) or self.leaves[g].numel() == 0:
            return
        if scale != 1.0:
            grad.mul_(scale)
        self.leaves[g].grad = grad
        self.opts[g].step()
        self.leaves[g].grad = None

    def state_bytes(self) -> int:
        return sum(2 * 4 * leaf.numel() for leaf in self.leaves)

    def state_tensors(self, g: int) -> dict[str, torch.Tensor]:
        """exp_avg, exp_avg_sq and step of group g ({} before the first step)."""
        return dict(self.opts[g].state.get(self.leaves[g], {}))

    def load_state_tensors(self, g: int, st: dict[str, torch.Tensor]) -> None:
        if st:
            self.opts[g].state[self.leaves[g]] = {k: v.clone() for k, v in st.items()}


class Worker:
    """One background thread that runs optimizer updates in submission order.

    torch's CPU kernels release the GIL and use their own intra-op threads, so one Python
    thread is enough to keep every core busy while the main thread drives the device.
    """

    def __init__(self):
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="outcore-optim")

    def submit(self, fn, *args) -> cf.Future:
        return self._pool.submit(fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
