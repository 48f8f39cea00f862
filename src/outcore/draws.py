"""Random tensors drawn in parallel, with values that depend on a seed and the shape only.

torch's CPU generator is serial: one thread draws about 0.2 G normal and 0.3 G uniform
values a second, so a 7B model's weights take half a minute or more to draw. RowBlocks cuts
a tensor into blocks of whole rows, each drawn from its own generator seeded from (seed,
name, block), on a pool of threads. Used by the engine's fill of a lazy model
(stream/materialize.py, meta.materialize) and by outcore.gemm.Linear's init.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch


def seed_of(seed: int, key: str) -> int:
    """A seed from (seed, key): blake2b, the same in every process (unlike hash())."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 2**63


class RowBlocks:
    """fill(name, tensor) from init_param(name, rows, generator) (a model's, or
    gemm.Linear's uniform draw), which draws each element on its own: the tensor is cut
    into blocks of whole rows of about CHUNK elements, each drawn from its own generator
    seeded from (seed, name, block), on a pool of threads (a single-threaded
    torch.normal_ makes about 0.2 G values/s: a minute for 15B). The cuts depend on the
    shape only, so the values do not depend on the thread count."""

    CHUNK = 1 << 22

    def __init__(self, init_param: Callable, seed: int):
        self.init_param, self.seed = init_param, seed
        self.pool = ThreadPoolExecutor(max(1, torch.get_num_threads()))

    def __call__(self, name: str, t: torch.Tensor) -> None:
        if t.dim() < 2:   # a vector (or scalar) is one block
            self._block(name, t, 0)
            return
        step = max(1, self.CHUNK // max(1, t[0].numel()))
        jobs = [self.pool.submit(self._block, name, t[r:r + step], r // step)
                for r in range(0, t.shape[0], step)]
        for j in jobs:
            j.result()   # re-raises an error of init_param here, in the caller's thread

    def close(self) -> None:
        """Let the threads go (once every tensor is filled)."""
        self.pool.shutdown()

    def _block(self, name: str, rows: torch.Tensor, i: int) -> None:
        gen = torch.Generator().manual_seed(seed_of(self.seed, f"{name}:{i}"))
        self.init_param(name, rows, gen)
