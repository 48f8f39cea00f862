"""Streams and events, with a CPU fallback that runs the same code synchronously.

One copy stream each way (host->device, device->host) and the compute stream. Every wait
between them goes through `wait(stream, event)` so that it is visible (and commented) at the
call site; on the CPU all of them are no-ops because every operation is already ordered.
"""

from __future__ import annotations

import contextlib

import torch


class Lanes:
    """The three streams of one compute device: h2d, d2h and compute (the current stream)."""

    def __init__(self, device: torch.device, light: bool = False, copy_streams=None):
        """copy_streams: (h2d, d2h) streams of `device` to use instead of two new ones."""
        self.device = device
        self.cuda = device.type == "cuda"
        self.light = light   # `on` by torch.cuda.set_stream (_StreamOn), see there
        if self.cuda:
            self.compute = torch.cuda.current_stream(device)
            self.h2d, self.d2h = copy_streams or (torch.cuda.Stream(device),
                                                  torch.cuda.Stream(device))
        else:
            self.compute = self.h2d = self.d2h = None

    def event(self, stream=None):
        """Record an event on `stream` (default: compute); None on the CPU."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(stream if stream is not None else self.compute)
        return ev

    def wait(self, stream, event) -> None:
        """Make `stream` wait for `event` (device-side; the host does not block)."""
        if self.cuda and event is not None:
            stream.wait_event(event)

    def timed_wait(self, stream, event):
        """`wait`, bracketed by timing events so the stall can be measured after a sync."""
        if not (self.cuda and event is not None):
            return None
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record(stream)
        stream.wait_event(event)
        b.record(stream)
        return (a, b)

    def on(self, stream):
        """Run the enclosed work on `stream` (no-op on the CPU)."""
        if not (self.cuda and stream is not None):
            return contextlib.nullcontext()
        return _StreamOn(stream) if self.light else torch.cuda.stream(stream)


class _StreamOn:
    """`stream` current for the enclosed work, the one before it current again after, by
    torch.cuda.set_stream; torch.cuda.stream() where the current device is not the
    stream's (that context also puts the other device's stream back). The context looks
    the current device up twice an entry, which counts where the host issues work about
    as fast as the device runs it (the gemm worker: gemm/worker.py LIGHT_STREAM_CTX)."""
    __slots__ = ("stream", "index", "prev", "ctx")

    def __init__(self, stream):
        self.stream, self.index = stream, stream.device_index
        self.prev = self.ctx = None

    def __enter__(self):
        if torch.cuda.current_device() != self.index:
            self.ctx = torch.cuda.stream(self.stream)
            return self.ctx.__enter__()
        self.prev = torch.cuda.current_stream(self.index)
        torch.cuda.set_stream(self.stream)

    def __exit__(self, *exc):
        if self.ctx is not None:
            return self.ctx.__exit__(*exc)
        torch.cuda.set_stream(self.prev)
        return False


def host_wait(event) -> None:
    """Block the calling host thread until `event` has completed (a deliberate host sync)."""
    if event is not None:
        event.synchronize()
