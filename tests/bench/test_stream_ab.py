"""bench/stream_ab.py: one bench/stream.py command per variant, the GPU tests in the first
only, each into its own results file; an unknown variant is a one-line exit."""

import argparse

import pytest

from .test_stream_append import load_stream_bench


def args(**kw):
    base = dict(case="3b-16k", variants="tune,settle", compiled=True, skip_tests=False,
                tag="", steps=5)
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
    eight = ab.commands(args(steps=8))[0][1]
    assert eight[eight.index("--steps") + 1] == "8"
    with pytest.raises(SystemExit, match="unknown variant 'fast'"):
        ab.commands(args(variants="settle,fast"))


def test_stream_ab_names_its_files_by_tag_case_and_variant():
    ab = load_stream_bench("stream_ab")
    assert ab.out_name("3b-16k", "balance") == "stream-h200-ab-balance"
    assert ab.out_name("1b-16k", "balance") == "stream-h200-ab-1b-16k-balance"
    assert ab.out_name("1b-16k", "keep", "copy") == "stream-h200-ab-copy-1b-16k-keep"
    for cmds in load_stream_bench("gpu_session").STEPS.values():   # the A/B steps tag
        for _, cmd in cmds:
            if cmd[1].endswith("stream_ab.py"):
                assert "--tag" in cmd, cmd
