"""Every rank must pass the same global batch: a fingerprint of it, compared across ranks.

The sharded engine splits ONE global batch into each rank's rows (shares.py). A program
written for DDP instead gives each rank its own batch (a sampler per rank, another seed):
each rank would then train on its share of a different batch, and the loss and gradients
would be those of no batch at all, silently. So before each step the ranks compare a
fingerprint of the batch they were given (one small all-reduce) and refuse to step on a
mismatch, on every rank alike.

The fingerprint reads each tensor's name, dtype, shape and at most SAMPLE evenly spaced
elements (a batch of images is tens of MB: hashing all of it each step would cost more
than the check is worth). Two batches that differ only between the sampled elements pass.
"""

from __future__ import annotations

import zlib

import torch

from ..errors import OutcoreError

SAMPLE = 4096   # elements read per tensor


def fingerprint(batch) -> float:
    """A 32-bit CRC of the batch's tensors (names, dtypes, shapes, sampled elements) and
    of its other values (numbers and strings by value, other objects by type), as a float
    (exact: below 2**53)."""
    crc = 0
    items = sorted(batch.items(), key=lambda kv: str(kv[0])) if isinstance(batch, dict) \
        else [("", batch)]
    for name, v in items:
        if isinstance(v, torch.Tensor):
            head = f"{name}:{v.dtype}:{tuple(v.shape)};"
            crc = zlib.crc32(head.encode(), crc)
            flat = v.detach().reshape(-1)
            if flat.numel():
                step = max(1, flat.numel() // SAMPLE)
                # Host sync where the batch lives on a GPU: SAMPLE elements, once a step.
                sample = flat[::step][:SAMPLE].cpu().contiguous()
                crc = zlib.crc32(sample.view(torch.uint8).numpy().tobytes(), crc)
        else:
            # plain values by value; other objects by type (a default repr holds an
            # address, which differs across processes)
            plain = isinstance(v, (int, float, str, bool, type(None)))
            text = repr(v) if plain else type(v).__name__
            crc = zlib.crc32(f"{name}={text};".encode(), crc)
    return float(crc)


def check_same_batch(comm, batch) -> None:
    """Collective: raise the same OutcoreError on every rank when some rank's batch differs
    from rank 0's (see the module docstring)."""
    if comm.world == 1:
        return
    table = comm.gather_rows([fingerprint(batch)])[:, 0].tolist()
    other = [r for r, f in enumerate(table) if f != table[0]]
    if other:
        raise OutcoreError(
            f"rank {other[0]} was given another batch than rank 0: distributed=True splits "
            "ONE global batch across ranks, so pass every rank the same batch (the same "
            "data order and seed), not a per-rank batch as with DDP")
