"""A token array cut into fixed-length rows, served in a seeded order.

Row r of step s is chunk perm[(s * B + r) % len(perm)]: the batch of any step is a pure
function of (seed, step), so a resumed run sees exactly the batches an uninterrupted one
would, with no loader state beyond the step count.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import OutcoreError


class PackedTokens:
    """tokens: N (int) -> batches {"input_ids": B x T, "labels": B x T}.

    labels: N (int) or None (= tokens); -100 marks tokens without loss (prompts). Rows
    with no label to learn (all prompt) are not served.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int = 0,
                 labels: np.ndarray | None = None):
        n = len(tokens) // seq_len
        if n < 1:
            raise OutcoreError(f"the data has {len(tokens)} tokens, fewer than one sequence of "
                               f"--seq-len {seq_len}: give more text or a shorter --seq-len")
        self.rows = torch.from_numpy(np.ascontiguousarray(tokens[: n * seq_len],
                                                          dtype=np.int64)).view(n, seq_len)
        self.labels = None if labels is None else torch.from_numpy(np.ascontiguousarray(
            labels[: n * seq_len], dtype=np.int64)).view(n, seq_len)
        # Served rows: those with a label to learn. A row of prompt only (a prompt longer
        # than --seq-len) has none: alone in a batch its mean loss would be NaN (0/0).
        # Label 0 is never a target (the models shift labels by one), so it does not count.
        keep = torch.arange(n) if self.labels is None else \
            torch.nonzero((self.labels[:, 1:] != -100).any(1)).flatten()
        if not len(keep):
            raise OutcoreError(f"every --seq-len {seq_len} sequence of the data is prompt "
                               "only (no response token to learn): give a longer --seq-len, "
                               "shorter prompts or longer responses")
        self.perm = keep[torch.randperm(len(keep),
                                        generator=torch.Generator().manual_seed(seed))]
        self.seq_len = seq_len

    def __len__(self) -> int:
        return self.rows.shape[0]

    def batch(self, step: int, batch_size: int) -> dict[str, torch.Tensor]:
        idx = (torch.arange(batch_size) + step * batch_size) % len(self.perm)
        rows = self.perm[idx]
        x = self.rows[rows]
        y = x.clone() if self.labels is None else self.labels[rows]
        return {"input_ids": x, "labels": y}
