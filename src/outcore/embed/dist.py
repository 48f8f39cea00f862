"""One process per device through torch.distributed (gloo for barriers, a TCPStore for the
bucket scheduler), launched by `spawn_fit` from one process, or by torchrun (each rank
calls `fit`, which finds RANK/WORLD_SIZE and goes to `torchrun_fit`), also across machines.
The host table is a memory-mapped file all ranks map (across machines: a path on a shared
filesystem, --table-path); each rank writes back a partition before releasing its lock, so
the next holder reads it whole."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

from . import childerr
from .buckets import StoreScheduler
from .config import EmbedConfig
from .sampling import EpochSource, NegativeSampler
from .table import EmbeddingTable
from .worker import Worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, world: int, cfg: EmbedConfig, device: str, table_args: dict,
             capacity: int, src, dst, weight, num_nodes: int, addr: str, port: int) -> dict:
    """Train as `rank`: open the shared table, join the scheduler, run every epoch."""
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=world)
    store = dist.TCPStore(addr, port + 1, world, rank == 0, wait_for_workers=False)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    # share the cores: ranks whose thread pools overlap spin against each other
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    table = EmbeddingTable(**table_args, create=False)
    P = table.P
    deg = (np.bincount(src, minlength=num_nodes) + np.bincount(dst, minlength=num_nodes)) \
        if cfg.neg_power else np.zeros(num_nodes, np.int64)   # uniform negatives need none
    sampler = NegativeSampler(deg, P, cfg.neg_power)
    source = EpochSource(src, dst, num_nodes, weight, cfg, P)
    worker = Worker(cfg, table, sampler, dev, capacity, None, rank, world)
    losses, epoch_s, seen, t0 = [], [], [], time.perf_counter()
    for e in range(cfg.epochs):
        edges = source.epoch(e)          # the same seeded epoch on every rank
        seen.append(edges)
        dist.barrier()                   # everyone finished the previous epoch
        te = time.perf_counter()
        sched = StoreScheduler(store, P, rank, edges.empty_units(cfg.directed),
                               prefix=f"embed/e{e}")
        dist.barrier()                   # rank 0 has published the fresh scheduler
        worker.sched = sched
        loss = worker.epoch(edges, None)
        losses.append(float(loss))       # host sync once per epoch, for the summary
        dist.barrier()                   # the epoch ends when the slowest rank is done
        epoch_s.append(time.perf_counter() - te)
    worker.cache.flush(drop=True)
    worker.close(seen)
    table.flush()
    dist.barrier()
    out = {"edges": worker.edges_done, "loss": losses, "wait_s": worker.wait_s,
           "epoch_s": epoch_s, "bytes_in": worker.cache.bytes_in,
           "bytes_out": worker.cache.bytes_out,
           "train_s": time.perf_counter() - t0}
    gathered = [None] * world
    dist.all_gather_object(gathered, out)
    del store                            # rank 0's scheduler server goes before the group
    if own:
        dist.destroy_process_group()
    return gathered


def under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def torchrun_fit(trainer, el, plan, table_kwargs: dict):
    """This process is one rank of a torchrun job: rank 0 creates the shared table file,
    every rank trains through `run_rank`; returns (positives trained, loss per epoch)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    cfg = trainer.cfg
    if cfg.devices:
        device = str(cfg.devices[local % len(cfg.devices)])
    else:
        device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    own_pg = not dist.is_initialized()
    if own_pg:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    # every rank must train the same partitioning: the free device memory each rank's plan
    # was sized by may differ, so rank 0's plan (and the table shape) is used everywhere
    box = [plan, table_kwargs]
    dist.broadcast_object_list(box, src=0)
    plan, table_kwargs = box
    trainer.plan = plan
    path = cfg.table_path or os.path.join("/dev/shm" if os.path.isdir("/dev/shm")
                                          else tempfile.gettempdir(),
                                          f"outcore-embed-{addr}-{port}.bin")
    table_args = dict(table_kwargs, path=path)
    if rank == 0:
        EmbeddingTable(**table_args, create=True).flush()
    dist.barrier()                       # the file exists before the others map it
    res = run_rank(rank, world, cfg, device, table_args, plan.capacity, el.src, el.dst,
                   el.weight, el.num_nodes, addr, port)
    if own_pg:
        dist.barrier()                   # no rank tears down gloo while another still talks
        dist.destroy_process_group()
    trainer.table = EmbeddingTable(**table_args, create=False)
    trainer.rank = rank
    trainer._temp_table = rank == 0 and not cfg.table_path
    trainer.rank_stats = res
    trainer.epoch_s = [max(r["epoch_s"][e] for r in res) for e in range(cfg.epochs)]
    done = sum(r["edges"] for r in res)
    per_epoch = [sum(r["loss"][e] for r in res) / max(done / cfg.epochs, 1)
                 for e in range(cfg.epochs)]
    return done, per_epoch


def _spawn_entry(rank, world, cfg, devices, table_args, capacity, data_path, num_nodes,
                 addr, port, result_path, error_paths):
    try:
        z = np.load(data_path)
        weight = z["weight"] if "weight" in z.files else None
        res = run_rank(rank, world, cfg, devices[rank], table_args, capacity, z["src"],
                       z["dst"], weight, num_nodes, addr, port)
    except Exception as e:
        childerr.save(e, error_paths[rank])   # a one-line error for the parent to raise
        raise
    if rank == 0:
        torch.save(res, result_path)


def _spawn(mp, cfg, el, devices, plan, table_args, tmp):
    """Write the edges into tmp, run the children, return rank 0's gathered stats."""
    data_path = os.path.join(tmp, "edges.npz")
    arrays = {"src": el.src, "dst": el.dst}
    if el.weight is not None:
        arrays["weight"] = el.weight
    np.savez(data_path, **arrays)
    result_path = os.path.join(tmp, "result.pt")
    error_paths = [os.path.join(tmp, f"error-{r}.pkl") for r in range(len(devices))]
    port = _free_port()
    from tqdm import tqdm
    if cfg.progress:
        tqdm.write(f"embed: {len(devices)} processes on {', '.join(map(str, devices))}")
    try:
        mp.spawn(_spawn_entry, nprocs=len(devices), join=True,
                 args=(len(devices), cfg, [str(d) for d in devices], table_args, plan.capacity,
                       data_path, el.num_nodes, "127.0.0.1", port, result_path, error_paths))
    except mp.ProcessRaisedException as e:
        err = childerr.load(error_paths, e.error_index)
        if err is None:
            raise                        # not a user error: the child's full traceback
        raise err from None              # as the single-process path raises it
    return torch.load(result_path, weights_only=False)


def spawn_fit(trainer, el, devices, plan):
    """Run one process per device; returns (positives trained, loss per epoch)."""
    import torch.multiprocessing as mp
    table = trainer.table
    table.flush()
    table_args = dict(num_nodes=table.num_nodes, dim=table.dim, partitions=table.P,
                      sides=table.sides, state_cols=table.state_cols, path=table.path,
                      init_scale=table.init_scale, seed=table.seed)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    try:
        if base and os.statvfs(base).f_bavail * os.statvfs(base).f_frsize < 3 * el.src.nbytes * 2:
            base = None
    except OSError:
        base = None
    cfg = trainer.cfg
    tmp = tempfile.mkdtemp(prefix="outcore-embed-", dir=base)
    try:                                 # the edges' copy goes also when a child fails
        res = _spawn(mp, cfg, el, devices, plan, table_args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # the children wrote the shared file; reopen so this process sees their flags
    trainer.table = EmbeddingTable(**table_args, create=False)
    done = sum(r["edges"] for r in res)
    per_epoch = [sum(r["loss"][e] for r in res) / max(done / cfg.epochs, 1)
                 for e in range(cfg.epochs)]
    trainer.rank_stats = res
    trainer.epoch_s = [max(r["epoch_s"][e] for r in res) for e in range(cfg.epochs)]
    return done, per_epoch
