"""`outcore gemm` through register/run with a parser built here."""

import argparse

from outcore.gemm.cli import register


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
