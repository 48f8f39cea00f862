"""Block-streaming trainer: host-resident fp32 state, blocks streamed to the device."""

from .engine import Engine
from .optimizer import AdamW

__all__ = ["Engine", "AdamW"]
