"""Typed configuration of node-embedding training, validated with one-line errors."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from ..errors import OutcoreError

SCORES = ("dot", "cosine")
LOSSES = ("softmax", "logistic", "ranking")
OPTIMIZERS = ("adagrad", "adam")
MODES = ("edges", "deepwalk", "node2vec")
STORAGES = ("auto", "ram", "mmap")


@dataclass
class EmbedConfig:
    """Everything that shapes a node-embedding run.

    Training unit: a batch of `batch_size` positive edges, cut into chunks of `chunk_size`;
    each chunk shares its own positives (batch negatives) and `num_negatives` nodes drawn
    by degree**neg_power as negatives for both ends, so scoring a chunk is one matmul
    (C x d) @ (d x (C + M)).
    """

    dim: int = 128
    epochs: int = 10
    lr: float = 0.1
    optimizer: str = "adagrad"          # row-wise Adagrad, or "adam" (lazy, per-row step)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-10
    exact_sparse: bool = False          # Adagrad: coalesce a row's repeats before squaring
    score: str = "dot"                  # "dot" or "cosine"
    loss: str = "softmax"               # "softmax" (PBG), "logistic" (LINE), "ranking"
    margin: float = 0.1                 # ranking loss only
    batch_size: int | None = None       # positive edges per step; None: E/64 in [4096, 2**18]
    chunk_size: int = 64                # positives sharing one set of negatives
    num_negatives: int = 64             # sampled negatives per chunk (each side)
    batch_negatives: bool = True        # also use the chunk's other positives as negatives
    neg_power: float = 0.75             # negatives ~ degree**neg_power (0 = uniform)
    init_scale: float = 0.1             # rows start uniform in [-init_scale, init_scale]
    directed: bool = False              # two vectors per node (source, target) when True
    mode: str = "edges"                 # "edges" (LINE), "deepwalk", "node2vec"
    walk_length: int = 20
    walks_per_node: int = 1             # per epoch
    window: int = 3
    p: float = 1.0                      # node2vec return parameter
    q: float = 1.0                      # node2vec in-out parameter
    partitions: int | None = None       # None: fewest that fit gpu_memory
    devices: list[str] = field(default_factory=list)   # [] -> cuda:0 if present, else cpu
    gpu_memory: int | None = None       # bytes of each device for table partitions
    storage: str = "auto"               # host table in RAM or a memory-mapped file
    table_path: str | None = None       # where a memory-mapped table lives
    edge_chunk: int = 1 << 24           # edges copied to the device at a time
    shuffle: bool = True                # edge blocks in random order once at load (host)
    seed: int = 0
    tf32: bool = True                   # TF32 matmuls for the negative scores on CUDA
    kernel: str = "torch"               # "fused": one Triton kernel a step (see fused.py)
    progress: bool = True

    def validate(self) -> "EmbedConfig":
        def pos_int(name):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise OutcoreError(f"{name}={v!r} must be a positive integer")
            setattr(self, name, int(v))          # a numpy integer works as well
        for name in ("dim", "epochs", "chunk_size", "walk_length",
                     "walks_per_node", "window", "edge_chunk"):
            pos_int(name)
        if self.batch_size is not None:
            pos_int("batch_size")
        if not _is_int(self.num_negatives) or self.num_negatives < 0:
            raise OutcoreError(f"num_negatives={self.num_negatives!r} must be an integer >= 0")
        if not _is_int(self.seed) or self.seed < 0:
            raise OutcoreError(f"seed={self.seed!r} must be an integer >= 0")
        g = self.gpu_memory
        if g is not None and (isinstance(g, bool) or not isinstance(g, numbers.Real)
                              or not math.isfinite(g) or g <= 0):
            raise OutcoreError(f"gpu_memory={g!r} must be a positive number of bytes, or None "
                               "to size it from the device")
        if self.num_negatives == 0 and (not self.batch_negatives or self.chunk_size == 1):
            raise OutcoreError("no negatives: set num_negatives > 0, or batch_negatives=True "
                               "with chunk_size > 1 (a chunk's other positives)")
        for name, allowed in (("score", SCORES), ("loss", LOSSES),
                              ("optimizer", OPTIMIZERS), ("mode", MODES),
                              ("storage", STORAGES)):
            if getattr(self, name) not in allowed:
                raise OutcoreError(f"{name}={getattr(self, name)!r} is not one of "
                                   f"{', '.join(allowed)}")
        if self.kernel not in ("torch", "fused"):
            raise OutcoreError(f"kernel={self.kernel!r} is not one of torch, fused")
        if self.kernel == "fused":
            from .fused import check_fused
            check_fused(self)
        if self.mode != "edges" and self.walk_length < 2:
            raise OutcoreError(f"walk_length={self.walk_length} gives {self.mode} no pairs to "
                               "train on: a walk needs at least 2 nodes")
        self._check_numbers()
        if self.partitions is not None:
            if not _is_int(self.partitions) or self.partitions < 1:
                raise OutcoreError(f"partitions={self.partitions!r} must be an integer >= 1, "
                                   "or None to plan it")
            self.partitions = int(self.partitions)
        if self.storage == "mmap" and not self.table_path:
            raise OutcoreError("storage='mmap' needs table_path: give a file path for the table")
        if self.storage == "ram" and self.table_path:
            raise OutcoreError("storage='ram' keeps no table file: drop table_path, or use "
                               "storage='mmap'")
        return self

    def _check_numbers(self) -> None:
        """The real-valued knobs: finite, and each in its range (a NaN or inf trains NaN
        rows or draws every negative from one node, with no error)."""
        def real(name, ok, what):
            v = getattr(self, name)
            if (isinstance(v, bool) or not isinstance(v, numbers.Real)
                    or not math.isfinite(v) or not ok(v)):
                raise OutcoreError(f"{name}={v!r} must be {what}")
        real("lr", lambda v: v > 0, "a finite number > 0")
        real("p", lambda v: v > 0, "a finite number > 0 (node2vec's return parameter)")
        real("q", lambda v: v > 0, "a finite number > 0 (node2vec's in-out parameter)")
        real("neg_power", lambda v: v >= 0, "a finite number >= 0 (negatives ~ degree**"
             "neg_power; 0: uniform)")
        real("init_scale", lambda v: v > 0, "a finite number > 0 (rows start uniform in "
             "[-init_scale, init_scale])")
        real("eps", lambda v: v > 0, "a finite number > 0")
        real("margin", lambda v: True, "a finite number")
        b = self.betas
        if not (isinstance(b, (tuple, list)) and len(b) == 2
                and all(isinstance(x, numbers.Real) and 0 <= x < 1 for x in b)):
            raise OutcoreError(f"betas={b!r} must be two numbers in [0, 1), e.g. (0.9, 0.999)")

    def resolved(self, num_edges: int) -> "EmbedConfig":
        """A copy with batch_size chosen when None: big batches keep a GPU busy (each step
        launches ~100 kernels), small graphs still get ~64 steps an epoch."""
        if self.batch_size is not None:
            return self
        import dataclasses
        return dataclasses.replace(self, batch_size=int(min(1 << 18, max(4096, num_edges // 64))))

    @property
    def sides(self) -> int:
        """Vectors per node: 1 (shared) or 2 (source and target, for directed graphs)."""
        return 2 if self.directed else 1


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)
