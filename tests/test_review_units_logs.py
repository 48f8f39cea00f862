"""Adversarial review of units (parse_bytes/fmt_bytes), logs (RunLog) and memory (PinnedPool)."""

import csv
import json

import pytest
import torch

from outcore.errors import OutcoreError
from outcore.logs import RunLog
from outcore.memory import PinnedPool
from outcore.units import fmt_bytes, parse_bytes


# -- units ---------------------------------------------------------------------------------

def test_parse_bytes_decimals_are_exact_not_float_rounded():
    assert parse_bytes("1.001KB") == 1001          # float gave 1000
    assert parse_bytes("1.003 kb") == 1003
    assert parse_bytes("9007199254740993") == 9007199254740993   # 2**53 + 1, float gave ...992
    assert parse_bytes("1.5 GB") == 1_500_000_000 and parse_bytes(" 16 gib ") == 16 * 1024**3


def test_parse_bytes_numbers_below_one_byte_are_refused_like_strings():
    for v in (0.5, 0.999, "0.5", "0.5B", "1e-40GiB"):
        with pytest.raises(OutcoreError, match="less than one byte"):
            parse_bytes(v)
    assert parse_bytes(1.9) == 1


@pytest.mark.parametrize("v", ["-1GiB", "-5", True, float("nan"), float("-inf"), "1e400",
                               "nan", "inf", "", "12 parsecs", "１６GiB", "16 GiB B"])
def test_parse_bytes_refuses_in_one_line(v):
    with pytest.raises(OutcoreError) as e:
        parse_bytes(v, "--gpu-memory")
    assert "\n" not in str(e.value) and "--gpu-memory" in str(e.value)


def test_parse_bytes_negative_says_positive_and_huge_exponent_is_quick():
    with pytest.raises(OutcoreError, match="positive"):
        parse_bytes("-1GiB")
    with pytest.raises(OutcoreError, match="finite"):
        parse_bytes("1e999999999")      # refused at once, no billion-digit integer


def test_fmt_bytes_non_finite_does_not_raise():
    assert fmt_bytes(float("nan")) == "nan B"    # int(nan) raised ValueError
    assert fmt_bytes(float("inf")) == "inf B"


def test_fmt_bytes_rounds_into_the_next_unit():
    assert fmt_bytes(1024**2 - 1) == "1.0 MiB"      # was '1024.0 KiB'
    assert fmt_bytes(1024**3 - 1) == "1.0 GiB"
    assert fmt_bytes(25769803776) == "24.0 GiB" and fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(1024) == "1.0 KiB" and fmt_bytes(3 * 1024**5) == "3072.0 TiB"
    assert fmt_bytes(-2048) == "-2.0 KiB"


@pytest.mark.parametrize("n", [1, 1023, 1024, 1536, 10**6, 24 * 1024**3, 1024**2 - 1])
def test_fmt_then_parse_is_close(n):
    back = parse_bytes(fmt_bytes(n))
    assert abs(back - n) <= 0.05 * n + 1


# -- logs ----------------------------------------------------------------------------------

def _strict(line):
    return json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_runlog_non_finite_values_are_null_in_strict_json_and_empty_in_csv(tmp_path):
    log = RunLog(tmp_path, tensorboard=False)
    log.write({"step": 1, "loss": 2.5, "grad_norm": float("nan"), "lr": float("inf")})
    log.close()
    row = _strict((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row == {"step": 1, "loss": 2.5, "grad_norm": None, "lr": None}
    with open(tmp_path / "metrics.csv", newline="") as f:
        (r,) = list(csv.DictReader(f))
    assert r["loss"] == "2.5" and r["grad_norm"] == "" and r["lr"] == ""


def test_runlog_resume_over_a_csv_with_other_columns(tmp_path):
    # a CSV from a version with another column set, or a row with more cells than the header
    (tmp_path / "metrics.csv").write_text("step,loss,old_col\n1,2.0,x\n2,1.5,y,extra\n3,1.0,z\n")
    log = RunLog(tmp_path, resume_step=2, tensorboard=False)
    log.write({"step": 3, "loss": 0.5})
    log.close()
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["loss"]) for r in rows] == [("1", "2.0"), ("2", "1.5"), ("3", "0.5")]


def test_runlog_a_key_added_mid_run_becomes_a_csv_column(tmp_path):
    """A caller's own metric from step 2 on: the JSONL had it, the CSV dropped it."""
    log = RunLog(tmp_path, tensorboard=False)
    log.write({"step": 1, "loss": 2.0})
    log.write({"step": 2, "loss": 1.5, "val_loss": 1.7})
    log.write({"step": 3, "loss": 1.0, "val_loss": 1.2})
    log.close()
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["loss"], r["val_loss"]) for r in rows] == [
        ("1", "2.0", ""), ("2", "1.5", "1.7"), ("3", "1.0", "1.2")]
    assert not list(tmp_path.glob("*.tmp"))
    # a resume keeps the column and its values up to the resumed step
    log = RunLog(tmp_path, resume_step=2, tensorboard=False)
    log.write({"step": 3, "loss": 0.9, "val_loss": 1.1})
    log.close()
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["val_loss"]) for r in rows] == [("1", ""), ("2", "1.7"), ("3", "1.1")]


def test_runlog_rows_reach_the_files_as_they_are_written(tmp_path):
    """A run without checkpoints flushed its log only at the end: `tail -f` showed nothing,
    and a crash lost every row still in the 8 KiB buffers."""
    log = RunLog(tmp_path, tensorboard=False)
    log.write({"step": 1, "loss": 1.0})
    assert _strict((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["loss"] == 1.0
    with open(tmp_path / "metrics.csv", newline="") as f:
        assert [r["loss"] for r in csv.DictReader(f)] == ["1.0"]
    log.close()


def test_runlog_close_twice_is_harmless(tmp_path):
    log = RunLog(tmp_path, tensorboard=False)
    log.write({"step": 1, "loss": 1.0})
    log.close()
    log.close()
    log.flush()


@pytest.mark.parametrize("where", ["dir_is_file", "jsonl_is_dir", "csv_is_dir"])
def test_runlog_unwritable_paths_are_one_line_errors(tmp_path, where):
    out = tmp_path / "out"
    if where == "dir_is_file":
        out.write_text("x")
    else:
        out.mkdir()
        (out / ("metrics.jsonl" if where == "jsonl_is_dir" else "metrics.csv")).mkdir()
    with pytest.raises(OutcoreError) as e:
        RunLog(out, tensorboard=False)
    msg = str(e.value)
    assert "\n" not in msg and str(out) in msg


# -- memory --------------------------------------------------------------------------------

def test_pinned_pool_double_put_is_refused_not_handed_out_twice():
    pool = PinnedPool(pin=False)
    a = pool.get(8, torch.float32)
    pool.put(a)
    with pytest.raises(OutcoreError):
        pool.put(a)
    x, y = pool.get(8, torch.float32), pool.get(8, torch.float32)
    assert x is not y


def test_pinned_pool_sizes_zero_and_odd():
    pool = PinnedPool(pin=False)
    z = pool.get(0, torch.float32)
    assert z.numel() == 0
    pool.put(z)
    assert pool.get(0, torch.float32) is z
    o = pool.get(7, torch.bfloat16)
    assert o.numel() == 7 and o.dtype == torch.bfloat16 and pool.bytes_allocated == 14
    pool.put(o)
    assert pool.get(7, torch.float16) is not o      # keyed by dtype too
