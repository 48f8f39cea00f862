"""Power-law graphs with planted communities, 1e4..1e9 edges, generated in chunks.

Model (Chung-Lu with communities): node i has weight w_i ~ rank**(-1/(gamma-1)) (so
degrees follow a power law of exponent gamma) and a community c_i (the label). An edge
picks its source by weight; its target by weight within the source's community with
probability 1 - mixing, else by weight among all nodes. Sampling by weight is a
searchsorted into cumulative weights (nodes sorted by community), in torch, so it runs on
the GPU as well as the CPU. Node ids are shuffled so that id says nothing of degree or
community. Self-loops are dropped and redrawn.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import OutcoreError
from .graph import format_int_columns


@dataclass
class GraphSpec:
    """num_nodes, num_edges; communities K; mixing = share of edges leaving the community;
    gamma = degree power-law exponent."""

    num_nodes: int
    num_edges: int
    communities: int = 16
    mixing: float = 0.1
    gamma: float = 2.5
    seed: int = 0

    def validate(self) -> "GraphSpec":
        if self.num_nodes < 2 or self.num_edges < 1:
            raise OutcoreError(f"graph needs >= 2 nodes and >= 1 edge, got {self.num_nodes} "
                               f"nodes and {self.num_edges} edges")
        if not 1 <= self.communities <= self.num_nodes:
            raise OutcoreError(f"communities={self.communities} must be in 1..num_nodes")
        if not 0.0 <= self.mixing <= 1.0:
            raise OutcoreError(f"mixing={self.mixing} must be in [0, 1]")
        if self.gamma <= 1.0:
            raise OutcoreError(f"gamma={self.gamma} must be > 1")
        return self


class PlantedGraph:
    """Sampler of a `GraphSpec` graph on `device`; `labels` (N int64) are communities."""

    def __init__(self, spec: GraphSpec, device: str | torch.device = "cpu"):
        self.spec = spec.validate()
        self.device = torch.device(device)
        dev = self.device
        g = torch.Generator(device=dev).manual_seed(spec.seed)
        n = spec.num_nodes
        rank = torch.randperm(n, generator=g, device=dev).double() + 1.0
        weight = rank.pow(-1.0 / (spec.gamma - 1.0))
        del rank
        comm = torch.randint(0, spec.communities, (n,), generator=g, device=dev)
        self.labels = comm.cpu().numpy()
        order = torch.argsort(comm, stable=True)               # nodes sorted by community
        cw = torch.cumsum(weight[order], 0)
        del weight
        counts = torch.bincount(comm, minlength=spec.communities)
        ends = torch.cumsum(counts, 0)
        starts = ends - counts
        base = torch.where(starts > 0, cw[(starts - 1).clamp(min=0)],
                           torch.zeros((), dtype=torch.float64, device=dev))
        total = cw[(ends - 1).clamp(min=0)] - base
        self.order, self.cw, self.comm = order, cw, comm
        self.base, self.total = base, total
        self.gen = torch.Generator(device=dev).manual_seed(spec.seed + 1)

    def _pick(self, r: torch.Tensor) -> torch.Tensor:
        pos = torch.searchsorted(self.cw, r).clamp_(max=self.cw.numel() - 1)
        return self.order[pos]

    def sample(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """m edges (fewer after dropping self-loops): (src, dst) int64 on the device."""
        dev, g = self.device, self.gen
        wsum = self.cw[-1]
        u = self._pick(torch.rand(m, generator=g, device=dev, dtype=torch.float64) * wsum)
        cu = self.comm[u]
        r = torch.rand(m, generator=g, device=dev, dtype=torch.float64)
        inside = self.base[cu] + r * self.total[cu]
        outside = r * wsum
        mix = torch.rand(m, generator=g, device=dev) < self.spec.mixing
        v = self._pick(torch.where(mix, outside, inside))
        keep = u != v
        return u[keep], v[keep]

    def chunks(self, chunk: int = 1 << 24):
        """Yield (src, dst) numpy int32/int64 chunks adding up to exactly num_edges."""
        left = self.spec.num_edges
        idt = torch.int32 if self.spec.num_nodes < 2**31 else torch.int64
        while left > 0:
            m = min(chunk, left)
            u, v = self.sample(m + m // 8 + 16)
            u, v = u[:m], v[:m]
            left -= int(u.numel())
            # narrow on the device: half the bytes cross to the host
            yield u.to(idt).cpu().numpy(), v.to(idt).cpu().numpy()


def generate(spec: GraphSpec, device="cpu", chunk: int = 1 << 24):
    """Whole graph in memory: (src, dst, labels) numpy arrays."""
    pg = PlantedGraph(spec, device)
    parts = list(pg.chunks(chunk))
    src = np.concatenate([p[0] for p in parts])
    dst = np.concatenate([p[1] for p in parts])
    return src, dst, pg.labels


def write_graph(spec: GraphSpec, edges_path: str, labels_path: str | None = None,
                device="cpu", chunk: int = 1 << 22, progress: bool = False) -> int:
    """Write the graph to `edges_path` (.npy: E x 2 array; else TSV) in chunks; labels as
    'node<TAB>community' lines. Returns the number of edges written."""
    pg = PlantedGraph(spec, device)
    d = os.path.dirname(os.path.abspath(edges_path))
    os.makedirs(d, exist_ok=True)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=spec.num_edges, unit="edge", unit_scale=True, desc="generate")
    done = 0
    from concurrent.futures import ThreadPoolExecutor
    if edges_path.endswith(".npy"):
        idt = np.int32 if spec.num_nodes < 2**31 else np.int64
        out = np.lib.format.open_memmap(edges_path, mode="w+", dtype=idt,
                                        shape=(spec.num_edges, 2))
        for u, v in pg.chunks(chunk):
            out[done:done + len(u), 0] = u
            out[done:done + len(u), 1] = v
            done += len(u)
            bar and bar.update(len(u))
        out.flush()
        del out
    else:
        # numpy's formatting releases the GIL: format chunks in threads, write in order
        with open(edges_path, "wb") as f, ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as ex:
            pending = []
            for u, v in pg.chunks(chunk):
                pending.append((len(u), ex.submit(format_int_columns, u, v)))
                if len(pending) >= 8:
                    n, fut = pending.pop(0)
                    f.write(fut.result())
                    done += n
                    bar and bar.update(n)
            for n, fut in pending:
                f.write(fut.result())
                done += n
                bar and bar.update(n)
    bar and bar.close()
    if labels_path:
        with open(labels_path, "wb") as f:
            f.write(format_int_columns(np.arange(spec.num_nodes), pg.labels))
    return done


def split_edges(src: np.ndarray, dst: np.ndarray, test_fraction: float, seed: int = 0):
    """Random hold-out: ((train_src, train_dst), (test_src, test_dst))."""
    if not 0.0 < test_fraction < 1.0:
        raise OutcoreError(f"test_fraction={test_fraction} must be in (0, 1)")
    rng = np.random.default_rng(seed)
    test = rng.random(len(src)) < test_fraction
    return (src[~test], dst[~test]), (src[test], dst[test])
