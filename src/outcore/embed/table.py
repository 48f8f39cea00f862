"""The embedding table in host memory (RAM or a memory-mapped file), cut into P partitions.

Node g lives in partition g % P at row g // P (striping balances partitions of power-law
graphs whose ids correlate with degree). The storage is one flat float32 buffer holding,
for each partition p in turn, its rows (n_p x W, W = dim * sides) and then its optimizer
state (n_p x S): the state lives beside the rows, so a partition and its state move
together. Rows start as a hash of (node id, column, seed): the same values whatever P and
whatever the device, so a partition never trained yet is created on the GPU instead of
being copied there.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..errors import OutcoreError

_M32 = 0xFFFFFFFF
# Initial rows are hashed INIT_ELEMS values at a time: the hash's int64 and float64
# temporaries peak at about HASH_BYTES per value (measured 40), which plan.py counts in
# the device workspace (a first fetch of 1M rows of width 256 at once peaked at 10 GiB)
INIT_ELEMS = 1 << 22
HASH_BYTES = 48


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # 32-bit avalanche hash kept inside int64 (constant < 2**31: products never overflow).
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def hash_init(ids: torch.Tensor, width: int, seed: int, scale: float) -> torch.Tensor:
    """ids: n int64 node ids -> n x width float32, uniform in [-scale, scale)."""
    col = torch.arange(width, device=ids.device, dtype=torch.int64)
    key = ids.to(torch.int64)[:, None] * width + col[None, :]
    h = _mix32((key & _M32) ^ _mix32((key >> 32) ^ (seed & _M32)))
    return (h.to(torch.float64) * (2.0 / 2**32) - 1.0).to(torch.float32) * scale


def _check_new_table_file(path: str, nbytes: int) -> None:
    """Creating a table overwrites `path`: refuse a file that is no earlier table (an
    earlier one has PATH.init beside it), e.g. the edge list or the embeddings; and refuse
    a disk too full to hold it (the file starts sparse, and a write into a page the disk has
    no room for kills the process with SIGBUS, in the middle of training)."""
    try:
        old = os.path.getsize(path) if os.path.isfile(path) else 0
        if old and not os.path.isfile(path + ".init"):
            raise OutcoreError(f"table file {path!r} already exists and is not a table from an "
                               "earlier run: creating the table would overwrite it; give a "
                               "new path or delete the file")
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return                      # np.memmap below names what is wrong with the path
    free = st.f_bavail * st.f_frsize + old
    if free < nbytes:
        raise OutcoreError(f"table file {path!r} needs {nbytes / 2**30:.2f} GiB but its "
                           f"filesystem has {free / 2**30:.2f} GiB free: free space or give a "
                           "path on another disk")


class EmbeddingTable:
    """num_nodes x (dim * sides) float32 rows plus S state columns per row, P partitions.

    path=None keeps it in RAM; with a path it is a memory-mapped file (created when
    `create`, else opened: how the ranks of a multi-process run share one table).
    """

    def __init__(self, num_nodes: int, dim: int, partitions: int = 1, sides: int = 1,
                 state_cols: int = 1, path: str | None = None, create: bool = True,
                 init_scale: float = 0.1, seed: int = 0):
        if num_nodes < 1 or dim < 1:
            raise OutcoreError(f"table needs >= 1 node and dim >= 1, got {num_nodes}, {dim}")
        if not 1 <= partitions <= num_nodes:
            raise OutcoreError(f"partitions={partitions} must be in 1..num_nodes={num_nodes}")
        self.num_nodes, self.dim, self.P, self.sides = num_nodes, dim, partitions, sides
        self.width, self.state_cols = dim * sides, state_cols
        self.init_scale, self.seed, self.path = init_scale, seed, path
        self.init_chunk = max(1, INIT_ELEMS // self.width)      # rows hashed at a time
        P = partitions
        self.sizes = [(num_nodes - p + P - 1) // P for p in range(P)]     # n_p
        row_floats = self.width + state_cols
        self.offsets = np.concatenate([[0], np.cumsum([n * row_floats for n in self.sizes])])
        total = int(self.offsets[-1])
        if path is None:
            self.flat = torch.zeros(total, dtype=torch.float32)
            self._init_flags = np.zeros(P, dtype=np.uint8)
        else:
            if create:
                _check_new_table_file(path, total * 4 + P)
            mode = "w+" if create else "r+"
            try:
                arr = np.memmap(path, dtype=np.float32, mode=mode, shape=(total,))
                flags = np.memmap(path + ".init", dtype=np.uint8, mode=mode, shape=(P,))
            except (OSError, ValueError) as e:
                raise OutcoreError(f"cannot map the table file {path!r} ({e}): check the "
                                   "path and free disk space") from None
            self._mm = arr
            self.flat = torch.from_numpy(arr)
            self._init_flags = flags

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1]) * 4

    def partition_bytes(self, p: int) -> int:
        return int(self.offsets[p + 1] - self.offsets[p]) * 4

    def rows(self, p: int) -> torch.Tensor:
        """Partition p's rows: n_p x W (a view of the host storage)."""
        a = int(self.offsets[p])
        return self.flat[a:a + self.sizes[p] * self.width].view(self.sizes[p], self.width)

    def state(self, p: int) -> torch.Tensor:
        """Partition p's optimizer state: n_p x S (a view)."""
        a = int(self.offsets[p]) + self.sizes[p] * self.width
        return self.flat[a:a + self.sizes[p] * self.state_cols].view(self.sizes[p],
                                                                     self.state_cols)

    def is_initialized(self, p: int) -> bool:
        return bool(self._init_flags[p])

    def mark_initialized(self, p: int) -> None:
        self._init_flags[p] = 1

    def node_ids(self, p: int, device="cpu", start: int = 0, stop: int | None = None):
        """Global ids of partition p's rows start..stop-1: int64."""
        stop = self.sizes[p] if stop is None else stop
        return torch.arange(start, stop, device=device, dtype=torch.int64) * self.P + p

    def initial_rows(self, p: int, device="cpu", start: int = 0, stop: int | None = None):
        """Rows start..stop-1 of partition p as first initialised: (stop-start) x W."""
        ids = self.node_ids(p, device, start, stop)
        return hash_init(ids, self.width, self.seed, self.init_scale)

    def materialize(self, p: int) -> None:
        """Write partition p's initial rows on the host (if it was never trained)."""
        if not self.is_initialized(p):
            n, c = self.sizes[p], self.init_chunk
            for a in range(0, n, c):
                self.rows(p)[a:a + c] = self.initial_rows(p, "cpu", a, min(n, a + c))
            self.state(p).zero_()
            self.mark_initialized(p)

    def locate(self, ids: np.ndarray | torch.Tensor):
        """Global ids -> (partition, row) arrays."""
        return ids % self.P, ids // self.P

    def gather(self, ids: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Rows of the given global node ids: n x W (host copy)."""
        ids = torch.as_tensor(np.asarray(ids), dtype=torch.int64)
        out = torch.empty(len(ids), self.width, dtype=torch.float32)
        part, row = self.locate(ids)
        for p in range(self.P):
            sel = torch.nonzero(part == p).flatten()
            if sel.numel():
                if self.is_initialized(p):
                    out[sel] = self.rows(p)[row[sel]]
                else:       # never trained: its rows are still the initial hash
                    out[sel] = hash_init(ids[sel], self.width, self.seed, self.init_scale)
        return out

    def embeddings(self, start: int = 0, stop: int | None = None, side: int = 0) -> torch.Tensor:
        """Rows start..stop-1 in node order, one side (0: source/shared, 1: target)."""
        stop = self.num_nodes if stop is None else stop
        full = self.gather(np.arange(start, stop))
        return full[:, side * self.dim:(side + 1) * self.dim]

    def load_(self, full: torch.Tensor) -> None:
        """Set all rows from a num_nodes x W tensor (node order); state is zeroed."""
        if tuple(full.shape) != (self.num_nodes, self.width):
            raise OutcoreError(f"load_ expects {self.num_nodes} x {self.width}, "
                               f"got {tuple(full.shape)}")
        for p in range(self.P):
            self.rows(p).copy_(full[p::self.P])
            self.state(p).zero_()
            self.mark_initialized(p)

    def flush(self) -> None:
        if self.path is not None:
            self._mm.flush()
            self._init_flags.flush()

    def close(self, delete: bool = False) -> None:
        self.flush()
        if delete and self.path is not None:
            for f in (self.path, self.path + ".init"):
                try:
                    os.remove(f)
                except OSError:
                    pass
