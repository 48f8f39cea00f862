"""Host memory: page-locked (pinned) buffers and host memory accounting; the CUDA
allocator's unused bytes."""

from .cudastats import cached_unused_bytes, cuda_index
from .pinned import (PinnedPool, clear_cuda_error, host_peak_rss_bytes, host_rss_bytes, pin_,
                     unpin_, unpin_all)

__all__ = ["cached_unused_bytes", "cuda_index", "PinnedPool", "clear_cuda_error", "pin_",
           "unpin_", "unpin_all", "host_rss_bytes", "host_peak_rss_bytes"]
