"""Data-parallel streaming over torch.distributed with host state sharded across ranks."""

from .engine import ShardedEngine
from .launch import init_distributed, relaunch, shutdown
from .shares import split_rows

__all__ = ["ShardedEngine", "init_distributed", "relaunch", "shutdown", "split_rows"]
