"""`outcore gemm` through register/run with a parser built here."""

import argparse

import numpy as np
import pytest
import torch

from outcore.gemm.cli import CHECK_CHUNK, check_sampled, register


def _parse(line: str):
    parser = argparse.ArgumentParser(prog="outcore")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(line.split())


def test_gemm_runs_checks_and_reports(capsys):
    args = _parse("gemm --m 70 --n 50 --k 90 --devices cpu,cpu --tile 16 --layout NT "
                  "--beta 0.5 --alpha 2 --repeat 2 --check 20")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "TFLOP/s" in out and "moved" in out and "minimum" in out
    assert "check: 20 sampled entries" in out and ": ok" in out
    assert "(warm-up); median of the 1 after it" in out   # the first product is not timed


def test_gemm_default_repeat_is_a_warmup_then_a_median(capsys):
    """The default runs 4 products: the first a warm-up, the median of the other 3 shown."""
    args = _parse("gemm --m 20 --n 30 --k 40 --devices cpu --check 8")
    assert args.repeat == 4 and args.func(args) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("first product"))
    times = [float(x) for x in line.split("(")[-1].rstrip(")").split(", ")]
    assert len(times) == 3 and f"after it {sorted(times)[1]:.3f} s" in line
    args = _parse("gemm --m 20 --n 30 --k 40 --devices cpu --check 8 --repeat 1")
    assert args.func(args) == 0
    assert "one product" in capsys.readouterr().out


def test_gemm_memmap_bf16_compute(tmp_path, capsys):
    args = _parse(f"gemm --m 40 --n 30 --k 64 --devices cpu --compute bf16 --layout TT "
                  f"--memmap {tmp_path}")
    assert args.func(args) == 0
    assert (tmp_path / "c.bin").stat().st_size == 40 * 30 * 4
    assert ": ok" in capsys.readouterr().out


def test_gemm_bad_input_is_one_line_and_exit_2(capsys):
    args = _parse("gemm --m 40 --n 30 --k 20 --devices cpu --gpu-memory 100 --tile 8")
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("outcore gemm: error: gpu_memory=100 B is too small")
    assert "\n" not in err
    args = _parse("gemm --m 0 --n 30 --k 20 --devices cpu")
    assert args.func(args) == 2
    args = _parse("gemm --m 4 --n 3 --k 2 --devices cuda:9")
    assert args.func(args) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("ta,tb,kind", [(False, False, "torch"), (True, False, "numpy"),
                                        (False, True, "numpy"), (True, True, "torch")])
def test_check_sampled_finds_one_wrong_entry_among_chunks(ta, tb, kind):
    """The sampled check against float64 (gathered CHECK_CHUNK entries at a time): a right
    C passes; one entry off by 1e-3 is found, in the last chunk, with its error."""
    rng = np.random.default_rng(0)
    m, n, k = 50, 40, 300
    a = rng.standard_normal((k, m) if ta else (m, k))
    b = rng.standard_normal((n, k) if tb else (k, n))
    c0 = rng.standard_normal((m, n))
    c = 2.0 * (a.T if ta else a) @ (b.T if tb else b) - 0.5 * c0
    idx = list(zip(rng.integers(0, m, 150), rng.integers(0, n, 150)))
    assert len(idx) > 2 * CHECK_CHUNK
    conv = (lambda x: torch.from_numpy(x)) if kind == "torch" else (lambda x: x)
    init = [c0[i, j] for i, j in idx]
    worst, ratio = check_sampled(conv(a), conv(b), conv(c), init, idx, ta, tb, 2.0, -0.5,
                                 "fp64")
    assert worst < 1e-11 and ratio < 1
    i, j = idx[-1]
    c[i, j] += 1e-3
    worst, ratio = check_sampled(conv(a), conv(b), conv(c), init, idx, ta, tb, 2.0, -0.5,
                                 "fp64")
    assert abs(worst - 1e-3) < 1e-9 and ratio > 1


def test_gemm_strassen_runs_and_checks(capsys):
    """--compute strassen: a product checked against float64 within its tolerance; with
    --tile (which it does not take) one line and exit 2."""
    args = _parse("gemm --m 90 --n 70 --k 110 --devices cpu --compute strassen --layout TN "
                  "--beta 0.5 --check 30")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "strassen-winograd" in out and "check: 30 sampled entries" in out and ": ok" in out
    args = _parse("gemm --m 40 --n 30 --k 20 --devices cpu --compute strassen --tile 8")
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip()
    assert "drop tile=" in err and "\n" not in err


@pytest.mark.parametrize("extra", ["--dtype bfloat16 --compute fp32",
                                   "--dtype float32 --compute fp64"])
def test_a_finer_compute_is_checked_at_the_stored_dtypes_tolerance(extra, capsys):
    """The result is rounded to the stored dtype: fp32 data multiplied in fp64 is as exact
    as fp32 storage, not as fp64."""
    args = _parse(f"gemm --m 64 --n 64 --k 64 --devices cpu --repeat 1 --check 32 {extra}")
    assert args.func(args) == 0
    assert ": ok" in capsys.readouterr().out


def test_a_nan_entry_fails_the_check():
    a, b = torch.randn(8, 5), torch.randn(5, 6)
    c = a @ b
    c[2, 3] = float("nan")
    idx = [(2, 3), (0, 0)]
    worst, ratio = check_sampled(a, b, c, [0.0, 0.0], idx, False, False, 1.0, 0.0, "fp32")
    assert worst == ratio == float("inf")


@pytest.mark.parametrize("line,pattern", [
    ("--check -1", "--check must be >= 0"),
    ("--repeat 0", "--repeat >= 1"),
    ("--alpha nan", "both must be finite"),
    ("--m 1000000000 --n 1000000000 --k 1000000000", "of host memory but"),
    ("--gpu-memory 1e400", "positive, finite"),
])
def test_more_bad_input_is_one_line_and_exit_2(line, pattern, capsys):
    args = _parse(f"gemm --m 8 --n 8 --k 8 --devices cpu {line}".replace(
        "--m 8 --n 8 --k 8 --devices cpu --m", "--devices cpu --m"))
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and pattern in err


def test_memmap_naming_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    args = _parse(f"gemm --m 8 --n 8 --k 8 --devices cpu --memmap {f}")
    assert args.func(args) == 2
    assert "is a file: give a directory" in capsys.readouterr().err
