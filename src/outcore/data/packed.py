"""A token array cut into fixed-length rows, served in a seeded order.

Row r of step s is chunk perm[(s * B + r) % n_chunks]: the batch of any step is a pure
function of (seed, step), so a resumed run sees exactly the batches an uninterrupted one
would, with no loader state beyond the step count.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import OutcoreError


class PackedTokens:
    """tokens: N (int) -> batches {"input_ids": B x T, "labels": B x T}."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int = 0):
        n = len(tokens) // seq_len
        if n < 1:
            raise OutcoreError(f"the data has {len(tokens)} tokens, fewer than one sequence of "
                               f"--seq-len {seq_len}: give more text or a shorter --seq-len")
        self.rows = torch.from_numpy(np.ascontiguousarray(tokens[: n * seq_len],
                                                          dtype=np.int64)).view(n, seq_len)
        self.perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        self.seq_len = seq_len

    def __len__(self) -> int:
        return self.rows.shape[0]

    def batch(self, step: int, batch_size: int) -> dict[str, torch.Tensor]:
        idx = (torch.arange(batch_size) + step * batch_size) % len(self)
        x = self.rows[self.perm[idx]]
        return {"input_ids": x, "labels": x.clone()}
