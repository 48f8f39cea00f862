"""AdamW on flat host buffers, run by a worker thread while the device computes.

`outcore.AdamW` is the user-facing config (the arguments of torch.optim.AdamW). Each group's
update is torch's functional AdamW over one flat fp32 tensor: AdamW is elementwise, so this
is exactly torch.optim.AdamW's update of the separate parameters, in one fused call.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch.optim.adamw import adamw as _torch_adamw

from ..errors import OutcoreError
from .cast_kernel import step_cast


@dataclass
class AdamW:
    """AdamW hyper-parameters, with torch.optim.AdamW's meaning and defaults."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self):
        def number(name, x) -> float:
            if not isinstance(x, numbers.Real) or isinstance(x, bool):
                raise TypeError(f"AdamW {name}={x!r} must be a number")
            return x
        betas = self.betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"AdamW betas={betas!r} must be a pair (beta1, beta2), such as "
                            "(0.9, 0.999)")
        self.betas = (number("betas[0]", betas[0]), number("betas[1]", betas[1]))
        inf = float("inf")
        # `not (... )` forms: nan fails every comparison, so it is refused too
        if not (0 <= number("lr", self.lr) < inf):
            raise OutcoreError(f"AdamW lr={self.lr} must be a finite number >= 0")
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise OutcoreError(f"AdamW betas={self.betas} must each be in [0, 1)")
        if not (0 < number("eps", self.eps) < inf):
            raise OutcoreError(f"AdamW eps={self.eps} must be a finite number > 0")
        if not (0 <= number("weight_decay", self.weight_decay) < inf):
            raise OutcoreError(f"AdamW weight_decay={self.weight_decay} must be a finite "
                               "number >= 0")


def _fused_cpu_available() -> bool:
    try:
        p = torch.zeros(2)
        _adamw([p], [torch.zeros(2)], [torch.zeros(2)], [torch.zeros(2)], [torch.zeros(())],
               lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, fused=True,
               grad_scale=torch.tensor(1.0))   # step() scales through the kernel
        return True
    except (RuntimeError, TypeError):
        return False


def _adamw(params, grads, m, v, steps, *, lr, betas, eps, weight_decay, fused,
           found_inf=None, grad_scale=None):
    """torch's functional AdamW (the code behind torch.optim.AdamW), fused when asked;
    the fused kernel divides the gradients by `grad_scale` as it reads them."""
    _torch_adamw(params, grads, m, v, [], steps, foreach=None if fused else True,
                            fused=fused or None, found_inf=found_inf, grad_scale=grad_scale,
                            amsgrad=False,
                            beta1=betas[0], beta2=betas[1], lr=lr, weight_decay=weight_decay,
                            eps=eps, maximize=False)


def inverse_scale(scale: float, device) -> torch.Tensor:
    """The fused kernels' grad_scale for a gradient multiplied by `scale` (they divide by
    it): one fp32 value, so every path that scales this way rounds alike. torch.full, not
    torch.tensor: on a GPU it is a fill kernel, where torch.tensor would copy from pageable
    memory and block the host."""
    return torch.full((), 1.0 / scale, dtype=torch.float32, device=device)


class GroupOptimizers:
    """AdamW state per group, flat and host-resident, updated on the CPU or on a device.

    m[g], v[g]: fp32, n_g (exp_avg, exp_avg_sq); steps[g]: fp32 scalar (torch's layout).
    AdamW is elementwise, so updating the flat buffer is exactly torch.optim.AdamW's update
    of the separate parameters. `step` runs on the CPU (a worker thread); `device_step`
    runs on the device on the group's weights already there (m and v streamed in and out).
    """

    def __init__(self, masters: list[torch.Tensor], cfg: AdamW):
        self.cfg = cfg
        self.lr = cfg.lr
        self.masters = masters
        self.m = [torch.zeros_like(x) for x in masters]
        self.v = [torch.zeros_like(x) for x in masters]
        self.steps = [torch.zeros(()) for _ in masters]
        self.fused = _fused_cpu_available()

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    def _kw(self, lr: float | None = None) -> dict:
        c = self.cfg
        return dict(lr=self.lr if lr is None else lr, betas=c.betas, eps=c.eps,
                    weight_decay=c.weight_decay)

    def step(self, g: int, grad: torch.Tensor, scale: float = 1.0,
             lr: float | None = None) -> None:
        """Update group g on the CPU with `grad` (fp32, flat; times `scale` first if != 1).
        lr: the rate of the step the gradient is from, if not the current one."""
        if self.masters[g].numel() == 0:
            return
        inv = None
        if scale != 1.0:
            if self.fused:   # scaled inside the kernel: no extra pass over the gradient
                inv = inverse_scale(scale, "cpu")
            else:
                grad.mul_(scale)
        _adamw([self.masters[g]], [grad], [self.m[g]], [self.v[g]], [self.steps[g]],
               fused=self.fused, grad_scale=inv, **self._kw(lr))

    def step_cast(self, g: int, grad: torch.Tensor, out16: torch.Tensor, kernel,
                  scale: float = 1.0, lr: float | None = None) -> None:
        """As `step`, and out16 = the updated weights in bf16, in the same pass over them
        (cast_kernel.py; `kernel` is its loaded extension)."""
        if self.masters[g].numel() == 0:
            return
        self.steps[g] += 1
        step_cast(kernel, self.masters[g], grad, self.m[g], self.v[g], out16,
                  step=int(self.steps[g]), scale=scale, **self._kw(lr))

    def device_step(self, g: int, w: torch.Tensor, grad: torch.Tensor, m: torch.Tensor,
                    v: torch.Tensor, found_inf: torch.Tensor | None, advance: bool = True,
                    grad_scale: torch.Tensor | None = None, lr: float | None = None) -> None:
        """Update group g on the device: w (fp32 weights), m, v in place; enqueued on the
        current stream, no host sync. Skipped by the kernel when found_inf != 0. A group
        updated in pieces (w, grad, m, v slices) passes advance=False but for the last.
        grad_scale: the kernel divides the gradient by it (as `step` does for a scale).
        found_inf None: never skipped; lr: as in `step`."""
        step = torch.full((), float(self.steps[g]), device=w.device)
        _adamw([w], [grad], [m], [v], [step], fused=True, found_inf=found_inf,
               grad_scale=grad_scale, **self._kw(lr))
        if advance:
            self.steps[g] += 1  # host copy of the count (the device one is discarded)

    def state_bytes(self) -> int:
        return sum(2 * 4 * x.numel() for x in self.masters)

    def state_tensors(self, g: int) -> dict[str, torch.Tensor]:
        """exp_avg, exp_avg_sq and step of group g."""
        return {"exp_avg": self.m[g], "exp_avg_sq": self.v[g], "step": self.steps[g]}

    def load_state_tensors(self, g: int, st: dict[str, torch.Tensor]) -> None:
        if st:
            self.m[g].copy_(st["exp_avg"].reshape(-1))
            self.v[g].copy_(st["exp_avg_sq"].reshape(-1))
            self.steps[g].copy_(st["step"].reshape(()))
