"""bench/balance_fit.py: the balance model's overlap exponent against the measured rows
in bench/results (what stream/balance.py's OVERLAP_K comment claims)."""

import math

from outcore.stream import balance

from .test_stream_append import load_stream_bench


def load():
    return load_stream_bench("balance_fit")


def rms(rows, k, fit):
    err = [fit.error(r, k) for r in rows]
    return math.sqrt(sum(e * e for e in err) / len(err))


def test_the_overlap_exponent_fits_better_than_the_larger_queue():
    fit = load()
    rows = fit.rows()
    assert len(rows) >= 20
    assert rms(rows, balance.OVERLAP_K, fit) < 0.10   # 9.4% over session 1-9's 31 rows
    assert rms(rows, balance.OVERLAP_K, fit) < rms(rows, math.inf, fit)


def test_the_simulated_step_fits_better_than_the_overlap_exponent():
    """stream/simulate.py's claim: 7.3% rms over the same 31 rows, with no fitted
    parameter, against the K model's 9.4%."""
    fit = load()
    rows = fit.rows()
    err = [fit.sim_error(r) for r in rows]
    sim = math.sqrt(sum(e * e for e in err) / len(err))
    assert sim < 0.08
    assert sim < rms(rows, balance.OVERLAP_K, fit)


def test_with_the_fused_copies_the_simulation_fits_better_than_the_queues():
    """stream/balance.py's MODEL comment: the simulation fits the fused-copy rows better
    (4.0% rms over session 10-12's 8 rows, against 14.6% for the queues model at K=4)."""
    fit = load()
    rows = fit.rows(fused=True)
    assert len(rows) >= 6
    err = [fit.sim_error(r) for r in rows]
    sim = math.sqrt(sum(e * e for e in err) / len(err))
    assert sim < 0.06
    assert sim < rms(rows, balance.OVERLAP_K, fit) / 2
