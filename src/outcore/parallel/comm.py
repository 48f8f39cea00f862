"""The collectives the sharded engine needs, on NCCL (GPU) or gloo (CPU).

A flat buffer of n elements is padded to P = ceil(n / N) * N and rank r owns the
contiguous slice [r * P/N, (r+1) * P/N). `all_gather(full, r)`: full: P, own slice already
written -> every slice filled. `reduce_scatter(grad)`: grad: P (this rank's partial sum)
-> P/N, the sum over ranks of this rank's slice.
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist

from ..errors import OutcoreError

warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor)"
                        ".*deprecated")


class Comm:
    """rank, world and the collectives of one process group (the default one)."""

    def __init__(self, watchdog=None):
        if not dist.is_initialized():
            raise OutcoreError("distributed=True needs torch.distributed initialised: launch "
                               "with torchrun (or outcore train --nproc N) and call "
                               "outcore.parallel.init_distributed() first")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.backend = dist.get_backend()
        self.nccl = self.backend == "nccl"
        self.watchdog = watchdog
        self.seconds = 0.0  # host time spent inside collectives (CPU: all of it)

    def _run(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        except RuntimeError as e:  # a peer died: let the watchdog name it, if it can
            dead = self._wait_dead()
            who = f"rank {', '.join(map(str, dead))}" if dead else "a peer rank"
            raise OutcoreError(f"rank {self.rank}: a collective failed because {who} died or "
                               f"is unreachable ({str(e).splitlines()[0][:120]})") from None
        finally:
            self.seconds += time.perf_counter() - t

    def _wait_dead(self) -> list[int]:
        if self.watchdog is None:
            return []
        for _ in range(int(self.watchdog.timeout / 0.5) + 10):
            if self.watchdog.dead():
                break
            time.sleep(0.5)
        return self.watchdog.dead()

    def all_gather(self, full: torch.Tensor) -> None:
        """full: P (P divisible by world) with this rank's slice written -> all slices."""
        if self.world == 1 or full.numel() == 0:
            return
        own = full.chunk(self.world)[self.rank]
        self._run(dist.all_gather_into_tensor, full, own)

    def reduce_scatter(self, grad: torch.Tensor) -> torch.Tensor:
        """grad: P, this rank's sum -> P/N: the sum over ranks of this rank's slice."""
        if self.world == 1 or grad.numel() == 0:
            return grad
        if self.nccl:
            out = torch.empty(grad.numel() // self.world, dtype=grad.dtype, device=grad.device)
            self._run(dist.reduce_scatter_tensor, out, grad)
            return out
        # gloo: all_reduce then keep this rank's slice (each rank moves P, not P/N, elements;
        # fine for CPU CI, where this path is for correctness, not speed).
        self._run(dist.all_reduce, grad)
        return grad.chunk(self.world)[self.rank]

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks of a small tensor (moved to the device for NCCL)."""
        if self.world == 1:
            return t
        if self.nccl and t.device.type != "cuda":
            d = t.to(f"cuda:{torch.cuda.current_device()}")
            self._run(dist.all_reduce, d)
            t.copy_(d.cpu())  # host sync: small scalars needed on the host
        else:
            self._run(dist.all_reduce, t)
        return t

    def gather_rows(self, values: list[float]) -> torch.Tensor:
        """values: k floats from this rank -> world x k (every rank's values)."""
        t = torch.zeros(self.world, len(values), dtype=torch.float64)
        t[self.rank] = torch.tensor(values, dtype=torch.float64)
        return self.sum_(t)

    def barrier(self) -> None:
        if self.world > 1:
            if self.nccl:
                self.sum_(torch.zeros(1))
            else:
                self._run(dist.barrier)
