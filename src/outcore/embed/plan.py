"""Before allocating: how many partitions, how many fit on a device, and the workspace."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import OutcoreError
from ..units import fmt_bytes
from .config import EmbedConfig
from .optim import RowOptimizer
from .step import num_chunks


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
    return int(edges + scores + rows + (64 << 20))


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
