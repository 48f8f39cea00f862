"""bench/lead_model.py: the lead's event model keeps to the physics it is built from."""

from .test_stream_append import load_stream_bench

RATES = dict(h2d_alone=54e9, h2d_duplex=51.7e9, d2h=51.8e9, flops=749e12)


def test_no_lead_ends_after_b_and_the_other_strips_compute():
    lm = load_stream_bench("lead_model")
    end, b_landed = lm.end_seconds(1, **RATES)
    assert abs(b_landed - (lm.A_BYTES + lm.PIECES * lm.B_PIECE) / 54e9) < 1e-9
    # every other strip computes after B, and C's last sub-strip goes out after that
    assert end > b_landed + (lm.STRIPS - 1) * lm.FLOP / 749e12 + lm.A_BYTES / lm.SUBS / 51.8e9


def test_each_strip_in_the_lead_delays_b_and_the_end_grows_past_a_few():
    lm = load_stream_bench("lead_model")
    runs = [lm.end_seconds(j, **RATES) for j in range(1, 6)]
    landed = [b for _, b in runs]
    assert all(abs((b1 - b0) - lm.A_BYTES / 54e9) < 1e-9 for b0, b1 in zip(landed, landed[1:]))
    ends = [e for e, _ in runs]
    assert min(ends) > 0.17 and ends[4] > ends[3] > ends[2]     # C's copies out set the end
    # every strip's bytes cross the link once: no end before the link could carry them
    assert all(e > (lm.STRIPS * lm.A_BYTES + lm.PIECES * lm.B_PIECE) / 54e9 for e in ends)
