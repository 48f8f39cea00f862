"""Before allocating: how many partitions, how many fit on a device, and the workspace."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import OutcoreError
from ..units import fmt_bytes
from .config import EmbedConfig
from .optim import RowOptimizer
from .step import num_chunks
from .table import HASH_BYTES, INIT_ELEMS


@dataclass
class Plan:
    partitions: int
    capacity: int              # partitions resident on one device at once
    partition_bytes: int       # device bytes of one slot (rows + state)
    workspace_bytes: int
    table_bytes: int           # host table (rows + state)

    def describe(self) -> str:
        where = ("whole table resident" if self.capacity >= self.partitions
                 else f"{self.capacity} of {self.partitions} partitions resident, streamed")
        return (f"{self.partitions} partition(s) of {fmt_bytes(self.partition_bytes)}, {where}; "
                f"host table {fmt_bytes(self.table_bytes)}, "
                f"device workspace {fmt_bytes(self.workspace_bytes)}")


# Beyond this the planner refuses rather than plan: P*(P+1)/2 units an epoch, each moving
# partitions of a few rows (the budget barely exceeds the workspace)
MAX_PLANNED_PARTITIONS = 1024


def state_cols(cfg: EmbedConfig) -> int:
    opt = RowOptimizer(cfg.optimizer)
    return cfg.sides * opt.state_cols(cfg.dim)


def workspace_bytes(cfg: EmbedConfig, max_bucket: int) -> int:
    """Device bytes besides the partitions: edge buffers and one step's temporaries."""
    B, d, M = cfg.batch_size, cfg.dim, cfg.num_negatives
    C = min(cfg.chunk_size, B)
    K = num_chunks(B, C)
    chunk = min(cfg.edge_chunk, max(max_bucket, 1))
    edges = chunk * (2 * 4 * 2 + 8 + 16)              # 2 buffers x (src, dst), perm, u/v
    scores = B * (C + M) * 4 * 2 * 4                   # both sides, ~4 live copies
    rows = B * d * 4 * 14 + K * M * d * 4 * 2 * 6      # gathers, grads, coalesce copies
    # a coalescing update (Adam, exact Adagrad) of a bucket (i, i) gathers both ends'
    # 2 (B + K*M) rows at once: sorted copies, then Adam's m, v and their temporaries
    # (measured on the CPU: 1.4-1.6x the terms above without this one)
    n = 2 * (B + K * M)
    coalesce = n * d * 4 * (12 if cfg.optimizer == "adam" else 4 if cfg.exact_sparse else 0)
    init = INIT_ELEMS * HASH_BYTES                     # hashing a partition's first rows
    return int(edges + scores + rows + coalesce + init + (64 << 20))


def epoch_positives(cfg: EmbedConfig, num_nodes: int, num_edges: int) -> int:
    """The most positives an epoch holds (the largest bucket's bound): the edges, or for
    walks every pair of every walk, often many times the edges."""
    if cfg.mode == "edges":
        return num_edges
    L = cfg.walk_length
    pairs = sum(L - k for k in range(1, min(cfg.window, L - 1) + 1))
    return min(num_nodes, 2 * num_edges) * cfg.walks_per_node * pairs


def device_budget(cfg: EmbedConfig, device: torch.device) -> int:
    if cfg.gpu_memory is not None:
        return int(cfg.gpu_memory)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.85)
    return 1 << 62                                     # the CPU path: no device limit


def make_plan(cfg: EmbedConfig, num_nodes: int, workers: int, budget: int,
              max_bucket_hint: int) -> Plan:
    """Fewest partitions such that a worker can hold a bucket plus a prefetch."""
    W = cfg.dim * cfg.sides
    S = state_cols(cfg)
    row = (W + S) * 4
    # the negative-sampling tables of all partitions stay resident: 8 bytes a node
    ws = workspace_bytes(cfg, max_bucket_hint) + (num_nodes * 8 if cfg.neg_power else 0)
    avail = budget - ws
    table_bytes = num_nodes * (W + S) * 4

    def slot(P):
        return (-(-num_nodes // P) + 1) * row

    if cfg.partitions is not None:
        P = min(cfg.partitions, num_nodes)
    elif workers == 1 and slot(1) <= avail:
        P = 1
    else:
        P = max(2, 8 * workers if workers > 1 else 2)   # room for every worker to reuse one
        while P < num_nodes and 3 * slot(P) > avail:
            P *= 2
        P = min(P, num_nodes)
        if P > MAX_PLANNED_PARTITIONS and avail > 0:
            raise OutcoreError(
                f"gpu_memory {fmt_bytes(budget)} leaves {fmt_bytes(avail)} beside the "
                f"workspace: the {fmt_bytes(table_bytes)} table would need {P:,} partitions "
                f"({P * (P + 1) // 2:,} buckets an epoch, each a swap); raise --gpu-memory, "
                "or give --partitions to insist")
    if workers > 1 and num_nodes < 2 * workers:
        raise OutcoreError(f"{workers} workers need at least {2 * workers} partitions of a "
                           f"node or more, and the graph has {num_nodes} nodes: use fewer "
                           "devices")
    if workers > 1 and P < 2 * workers:
        raise OutcoreError(f"{workers} workers need at least {2 * workers} partitions (each "
                           f"trains a pair of its own): raise --partitions")
    cap = int(avail // slot(P)) if avail > 0 else 0
    need = 1 if P == 1 else 2
    if cap < need:
        raise OutcoreError(
            f"gpu_memory {fmt_bytes(budget)} holds no bucket: {need} partition(s) of "
            f"{fmt_bytes(slot(P))} plus {fmt_bytes(ws)} of workspace; raise --gpu-memory, "
            "--partitions or lower --batch-size")
    return Plan(P, min(cap, P), slot(P), ws, table_bytes)
