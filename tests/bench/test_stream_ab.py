"""bench/stream_ab.py: one bench/stream.py command per variant, the GPU tests in the first
only, each into its own results file; an unknown variant is a one-line exit."""

import argparse

import pytest

from .test_stream_append import load_stream_bench


def args(**kw):
    base = dict(case="3b-16k", variants="tune,settle", compiled=True, skip_tests=False)
    return argparse.Namespace(**{**base, **kw})


def test_one_command_per_variant():
    ab = load_stream_bench("stream_ab")
    cmds = ab.commands(args())
    assert [n for n, _ in cmds] == ["tune", "settle"]
    first, second = (c for _, c in cmds)
    assert "--skip-tests" not in first and "--skip-tests" in second
    assert "--tune-updates" in first and "--settle-compiles" in second
    assert all("--compiled" in c and c[c.index("--out") + 1].startswith("stream-h200-ab-")
               for c in (first, second))
    with pytest.raises(SystemExit, match="unknown variant 'fast'"):
        ab.commands(args(variants="settle,fast"))
