"""bench/stream.py's largest row: sized by the host bytes per parameter the outcore process
was measured to use, so that it fits the machine (at 12.5 B/param the 8.56B row was killed
for host memory on the H200 machine's 128 GiB)."""

import os

from outcore.models import SIZES

from .test_stream_append import load_stream_bench


def params(layers: int) -> float:
    cfg = SIZES["7b"]
    per_layer = (cfg.num_params() - 2 * cfg.vocab * cfg.dim) / cfg.layers
    return layers * per_layer + 2 * cfg.vocab * cfg.dim


def test_largest_row_fits_the_host_at_the_measured_rate(monkeypatch):
    bench = load_stream_bench()
    ram = 128 * 2**30   # the H200 machine
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda k: ram // 4096 if k == "SC_PHYS_PAGES"
                        else 4096 if k == "SC_PAGE_SIZE" else real(k))
    layers = bench.largest_layers()
    assert params(layers) * bench.HOST_BYTES_PER_PARAM <= 0.85 * ram
    assert params(layers) * 15.5 <= 0.9 * ram    # 15.5: the largest rate measured
    assert params(layers) >= 7e9                 # issue 3's target still reachable
    assert params(layers + 1) * bench.HOST_BYTES_PER_PARAM > 0.85 * ram
