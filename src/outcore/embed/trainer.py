"""`EmbeddingTrainer`: node embeddings of an edge list, on one device or one process per
device through torch.distributed.

    trainer = EmbeddingTrainer(EmbedConfig(dim=128, epochs=10))
    table = trainer.fit(read_edges("edges.tsv"))
    trainer.save("emb.npy")
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import numpy as np
import torch

from ..errors import OutcoreError
from ..units import fmt_bytes
from .buckets import BucketScheduler
from .checked import is_checked
from .config import EmbedConfig
from .graph import EdgeList
from .output import save_embeddings
from .plan import Plan, device_budget, epoch_positives, make_plan, state_cols
from .sampling import EpochSource, NegativeSampler, Producer
from .table import EmbeddingTable
from .worker import Worker


def resolve_devices(devices) -> list[torch.device]:
    """[] -> [cuda:0] (or [cpu]); an int n -> n GPUs; strings -> those devices."""
    if devices in (None, [], ()):
        return [torch.device("cuda:0" if torch.cuda.is_available() else "cpu")]
    if isinstance(devices, int):
        devices = [f"cuda:{i}" for i in range(devices)]
    out = []
    for d in devices:
        try:
            dev = torch.device(d)
        except RuntimeError:
            raise OutcoreError(f"device {d!r} is not a torch device: write cpu or cuda:N") from None
        if dev.type not in ("cpu", "cuda"):
            raise OutcoreError(f"device {d!r} is not supported: write cpu or cuda:N")
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise OutcoreError(f"device {d} asked for but CUDA is not available: use cpu")
            if (dev.index or 0) >= torch.cuda.device_count():
                raise OutcoreError(f"device {d} does not exist: {torch.cuda.device_count()} "
                                   "GPU(s) are visible")
        out.append(dev)
    return out


def as_edgelist(edges, num_nodes=None) -> EdgeList:
    """A checked EdgeList: a hand-built one (or one an --holdout emptied) gets the same
    one-line errors as a (src, dst) pair, not a failure deep inside training. One from
    read_edges, unchanged since, was checked there: no second pass (see checked.py)."""
    if isinstance(edges, EdgeList):
        if is_checked(edges):
            return edges
        el, num_nodes = edges, edges.num_nodes
        edges = (el.src, el.dst)
    elif not (isinstance(edges, (tuple, list)) and len(edges) == 2):
        raise TypeError("edges must be an EdgeList (see read_edges) or a (src, dst) pair of "
                        "arrays")
    else:
        el = None
    src, dst = (np.asarray(x) for x in edges)
    if src.shape != dst.shape or src.ndim != 1:
        raise OutcoreError("edges must be (src, dst) 1-d arrays of equal length")
    if len(src) == 0:
        raise OutcoreError("no edges to train on")
    if not all(np.issubdtype(x.dtype, np.integer) for x in (src, dst)):
        raise OutcoreError(f"edges must hold integer node ids, not {src.dtype} and "
                           f"{dst.dtype}: cast them with .astype(np.int64), or read string "
                           "ids with read_edges")
    if num_nodes is not None and (isinstance(num_nodes, bool) or int(num_nodes) != num_nodes
                                  or num_nodes < 1):
        raise OutcoreError(f"num_nodes={num_nodes!r} must be a positive integer (ids are "
                           "0..num_nodes-1), or leave it out to take the largest id + 1")
    n = scan_edges(src, dst, num_nodes, None if el is None else el.weight)
    return EdgeList(src, dst, n) if el is None else el


def scan_edges(src, dst, num_nodes, weight) -> int:
    """The full passes over the edges: ids in 0..n-1 and weights (if any) finite, >= 0 and
    not all zero; returns n (num_nodes, or the largest id + 1 when None)."""
    n = int(max(src.max(), dst.max())) + 1 if num_nodes is None else int(num_nodes)
    if min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n:
        raise OutcoreError(f"node ids must lie in 0..{n - 1}")
    if weight is not None:
        w = np.asarray(weight)
        if w.shape != src.shape or w.dtype.kind not in "fiu" or not np.isfinite(w).all() \
                or (w < 0).any() or not w.sum() > 0:
            raise OutcoreError("edge weights must be one finite number >= 0 per edge, not all "
                               "zero")
    return n


# Host bytes a node costs whatever the table's storage: its degree and its entry in the
# negative-sampling table (int64 and float64, besides the bincounts' temporaries)
NODE_HOST_BYTES = 16


def check_node_count(num_nodes: int) -> None:
    """A one-line error when ids run so high that the per-node host arrays alone exceed
    this machine's memory (a typo'd or hashed id, not a graph): before any allocation."""
    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = num_nodes * NODE_HOST_BYTES
    if need > phys:
        raise OutcoreError(f"node ids up to {num_nodes - 1:,} make a table of {num_nodes:,} "
                           f"rows, whose per-node host arrays alone need {fmt_bytes(need)} "
                           f"(this machine has {fmt_bytes(phys)}): renumber the nodes 0..N-1 "
                           "without large gaps")


class EmbeddingTrainer:
    """Trains an `EmbeddingTable` on an edge list; see `EmbedConfig` for the knobs."""

    def __init__(self, config: EmbedConfig | None = None, **overrides):
        cfg = dataclasses.replace(config or EmbedConfig(), **overrides)
        self.cfg = cfg.validate()
        self._picked_batch = None       # the batch size fit chose for the last graph
        self.table: EmbeddingTable | None = None
        self.plan: Plan | None = None
        self.summary: dict = {}
        self.record = None            # test hook, see Worker.record
        self.names = None
        self.rank = 0                 # under torchrun: this process's rank

    def _storage_path(self, table_bytes: int, shared: bool) -> str | None:
        cfg = self.cfg
        if cfg.table_path:
            return cfg.table_path
        if not shared:
            phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            if cfg.storage == "ram" or (cfg.storage == "auto" and table_bytes < phys // 2):
                return None
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        try:
            st = os.statvfs(base)
            if st.f_bavail * st.f_frsize < table_bytes * 1.1:
                base = tempfile.gettempdir()
        except OSError:
            base = tempfile.gettempdir()
        return os.path.join(base, f"outcore-embed-{os.getpid()}-{time.time_ns()}.bin")

    def fit(self, edges, num_nodes: int | None = None) -> EmbeddingTable:
        """Train for cfg.epochs; returns the host table (also kept as self.table)."""
        el = as_edgelist(edges, num_nodes)
        check_node_count(el.num_nodes)
        self.names = el.names
        self.close()                  # a second fit: the first one's temporary table file
        if self.cfg.batch_size is not None and self.cfg.batch_size == self._picked_batch:
            self.cfg = dataclasses.replace(self.cfg, batch_size=None)    # chosen again
        picked = self.cfg.batch_size is None
        self.cfg = cfg = self.cfg.resolved(len(el))
        self._picked_batch = cfg.batch_size if picked else None
        from .dist import spawn_fit, torchrun_fit, under_torchrun
        torchrun = under_torchrun()
        devices = resolve_devices(cfg.devices)
        world = int(os.environ["WORLD_SIZE"]) if torchrun else len(devices)
        mine = devices[0]
        if torchrun and mine.type == "cuda":
            # this rank's own GPU (as torchrun_fit picks it): asking cuda:0 would put a CUDA
            # context of every rank on GPU 0; dist.py then takes rank 0's plan everywhere
            local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
            mine = torch.device(cfg.devices[local % len(cfg.devices)]) if cfg.devices \
                else torch.device("cuda", local)
        budget = device_budget(cfg, mine)
        self.plan = plan = make_plan(cfg, el.num_nodes, world, budget,
                                     epoch_positives(cfg, el.num_nodes, len(el)))
        P = plan.partitions
        table_kwargs = dict(num_nodes=el.num_nodes, dim=cfg.dim, partitions=P, sides=cfg.sides,
                            state_cols=state_cols(cfg), init_scale=cfg.init_scale, seed=cfg.seed)
        t0 = time.perf_counter()
        if torchrun:
            done, losses = torchrun_fit(self, el, plan, table_kwargs)
            plan, P = self.plan, self.plan.partitions      # rank 0's plan (see dist.py)
        else:
            path = self._storage_path(plan.table_bytes, shared=world > 1)
            self.table = EmbeddingTable(**table_kwargs, path=path)
            self._temp_table = path is not None and not cfg.table_path
            t0 = time.perf_counter()
            if world == 1:
                done, losses = self._fit_local(el, devices[0], plan)
            else:
                done, losses = spawn_fit(self, el, devices, plan)
        wall = time.perf_counter() - t0
        self.summary = {
            "nodes": el.num_nodes, "edges": len(el), "epochs": cfg.epochs,
            "positives_trained": int(done), "wall_s": wall,
            "edges_per_s": done / wall if wall > 0 else 0.0,
            "partitions": P, "resident": plan.capacity, "devices": [str(d) for d in devices],
            "loss_per_epoch": losses, "plan": plan.describe(),
            "epoch_s": list(getattr(self, "epoch_s", [])),
        }
        return self.table

    def _fit_local(self, el: EdgeList, device, plan: Plan):
        cfg, P = self.cfg, plan.partitions
        # degrees only weigh negatives when neg_power != 0 (uniform negatives need none)
        degrees = el.degrees() if cfg.neg_power else np.zeros(el.num_nodes, np.int64)
        sampler = NegativeSampler(degrees, P, cfg.neg_power)
        source = EpochSource(el.src, el.dst, el.num_nodes, el.weight, cfg, P)
        sched = BucketScheduler(P)
        worker = Worker(cfg, self.table, sampler, device, plan.capacity, sched)
        worker.record = self.record
        producer = None if source.static else Producer(source, 0, cfg.epochs)
        bar = _bar(cfg, "embed")
        losses, self.epoch_s, seen = [], [], []
        try:
            for e in range(cfg.epochs):
                te = time.perf_counter()
                edges = producer.get() if producer else source.epoch(e)
                seen.append(edges)
                if bar is not None and e == 0:
                    bar.total = len(edges.src) * cfg.epochs
                sched = BucketScheduler(P, edges.empty_units(cfg.directed))
                worker.sched = sched
                loss = worker.epoch(edges, bar)
                # host sync once per epoch: the loss for the progress line and summary
                losses.append(float(loss) / max(len(edges.src), 1))
                self.epoch_s.append(time.perf_counter() - te)
                if bar is not None:
                    bar.set_postfix(epoch=e + 1, loss=f"{losses[-1]:.4f}")
            worker.cache.flush()
        finally:
            if bar is not None:
                bar.close()
            worker.close(seen)
        self.table.flush()
        self.summary_io = {"bytes_in": worker.cache.bytes_in, "bytes_out": worker.cache.bytes_out}
        return worker.edges_done, losses

    def embeddings(self, side: int = 0) -> torch.Tensor:
        """num_nodes x dim (one side: 0 = source/shared, 1 = target of a directed run)."""
        if self.table is None:
            raise OutcoreError("call fit() before embeddings()")
        return self.table.embeddings(side=side)

    def save(self, path: str, fmt: str | None = None) -> list[str]:
        """Write the embeddings (row i = node i) and, for string ids, the id mapping."""
        if self.table is None:
            raise OutcoreError("call fit() before save()")
        return save_embeddings(self.table, path, fmt, self.names)

    def close(self) -> None:
        """Remove a temporary memory-mapped table file."""
        if self.table is not None and getattr(self, "_temp_table", False):
            self.table.close(delete=True)
            self._temp_table = False

    def describe(self) -> str:
        s = self.summary
        return (f"{s['positives_trained']:,} positive edges in {s['wall_s']:.2f} s "
                f"({s['edges_per_s'] / 1e6:.2f} M edges/s) on {', '.join(s['devices'])}; "
                f"{s['plan']}; final loss {s['loss_per_epoch'][-1]:.4f}")


def _bar(cfg: EmbedConfig, desc: str):
    if not cfg.progress:
        return None
    from tqdm import tqdm
    return tqdm(total=0, unit="edge", unit_scale=True, desc=desc, smoothing=0.1)


__all__ = ["EmbeddingTrainer", "resolve_devices", "as_edgelist", "fmt_bytes"]
