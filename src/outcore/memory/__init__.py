"""Host memory: page-locked (pinned) buffers and host memory accounting."""

from .pinned import (PinnedPool, clear_cuda_error, host_peak_rss_bytes, host_rss_bytes, pin_,
                     unpin_, unpin_all)

__all__ = ["PinnedPool", "clear_cuda_error", "pin_", "unpin_", "unpin_all", "host_rss_bytes",
           "host_peak_rss_bytes"]
