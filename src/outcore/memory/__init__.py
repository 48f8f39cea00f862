"""Host memory: page-locked (pinned) buffers and host memory accounting."""

from .pinned import PinnedPool, pin_, unpin_, host_rss_bytes, host_peak_rss_bytes

__all__ = ["PinnedPool", "pin_", "unpin_", "host_rss_bytes", "host_peak_rss_bytes"]
