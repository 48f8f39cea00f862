"""Starting the ranks: torchrun (one machine or many), or `outcore train --nproc N`.

    torchrun --nproc-per-node 2 -m outcore.cli train --model 3b ...        # one machine
    torchrun --nnodes 2 --node-rank K --nproc-per-node 8 \\
             --rdzv-backend c10d --rdzv-endpoint HOST0:29500 -m outcore.cli train ...
    outcore train --nproc 2 ...   # re-executes itself under torchrun on this machine

Each rank calls `init_distributed()`: NCCL when CUDA is there (rank -> cuda:LOCAL_RANK),
gloo otherwise, a 60 s collective timeout, and the heartbeat watchdog (watchdog.py).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import torch
import torch.distributed as dist

from ..errors import OutcoreError
from .watchdog import Watchdog

_WATCHDOG: Watchdog | None = None


def use_distributed(flag: bool | None) -> bool:
    """distributed=True, or None with an initialised process group of more than one rank."""
    if flag is None:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return bool(flag)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(backend: str | None = None, timeout_s: float = 60.0,
                     heartbeat_s: float = 20.0) -> Watchdog | None:
    """Join the job torchrun (or a test) described in the environment; returns the watchdog.

    heartbeat_s: a rank silent that long is declared dead and every other rank exits.
    """
    global _WATCHDOG
    if not under_torchrun():
        raise OutcoreError("init_distributed() needs RANK, WORLD_SIZE, MASTER_ADDR and "
                           "MASTER_PORT: launch with torchrun or outcore train --nproc N")
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    if _WATCHDOG is None and dist.get_world_size() > 1:
        store = dist.PrefixStore("outcore/", dist.distributed_c10d._get_default_store())
        _WATCHDOG = Watchdog(store, dist.get_rank(), dist.get_world_size(),
                             timeout=heartbeat_s)
    return _WATCHDOG


def watchdog() -> Watchdog | None:
    return _WATCHDOG


def shutdown() -> None:
    """Leave the job cleanly (a barrier first, so nobody's heartbeat reader sees us go)."""
    global _WATCHDOG
    if dist.is_initialized():
        dist.barrier()
        if _WATCHDOG is not None:
            _WATCHDOG.stop()
            _WATCHDOG = None
        dist.destroy_process_group()


def local_device() -> str:
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


def relaunch(nproc: int, argv: list[str], max_restarts: int = 0) -> int:
    """Run `outcore <argv>` under torchrun with nproc ranks on this machine; its exit code."""
    if nproc < 1:
        raise OutcoreError(f"--nproc {nproc} must be >= 1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
           "-m", "outcore.cli", *argv]
    return subprocess.call(cmd)
