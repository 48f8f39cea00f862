"""Review of `outcore plan`: bad option values are one line, refusals carry numbers that add
up, and the plan's micro-batch choice follows the same 92% rule as its verdict."""

import re

import pytest

from outcore.cli import main
from outcore.planner import make_plan, model_shape
from outcore.units import fmt_bytes

MiB, GiB = 1 << 20, 1 << 30


def _plan(capsys, *args):
    rc = main(["plan", "--no-calibrate", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip()


def _one_line(err):
    assert err and len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def tiny():
    return model_shape("tiny")


def test_host_refusal_counts_the_checkpoints_that_spill_to_the_host():
    """7b at 1M tokens a step: the state (100 GiB) fits 120 GiB but the activation
    checkpoints that do not fit on the GPU do not; the refusal said 'needs 100.4 GiB ... but
    120.0 GiB is available', which contradicts its own verdict."""
    s = model_shape("7b")
    p = make_plan(s, tokens_per_step=1 << 20, gpu_limit=24 * GiB, host_limit=120 * GiB)
    assert p.host_state_bytes < p.host_limit and not p.fits_host
    why = p.refusal()
    m = re.search(r"needs ([0-9.]+ [KMGT]iB) of host memory", why)
    need = p.host_state_bytes + p.checkpoint_bytes - p._device_room()
    assert m and m.group(1) == fmt_bytes(p.host_state_bytes), why
    assert f"({fmt_bytes(need)} in all)" in why, why
    assert "activation checkpoints" in why and "--batch-size" in why
    host_line = next(ln for ln in p.lines() if ln.startswith("host:"))
    assert fmt_bytes(need) in host_line and host_line.endswith("DOES NOT FIT")


def test_device_refusal_says_the_share_of_the_budget_it_plans_to_fill(tiny):
    """needs 6.8 MiB ... but the budget is 7.0 MiB: the 92% rule must be in the line."""
    p = make_plan(tiny, tokens_per_step=1024, micro_tokens=1024, gpu_limit=7 * MiB)
    assert p.device_bytes < p.gpu_limit and not p.fits_device
    why = p.refusal()
    assert fmt_bytes(int(7 * MiB * 0.92)) in why and "92%" in why, why


def test_automatic_micro_batch_halves_until_it_fits_the_usable_budget(tiny):
    """micro_tokens=None: 'the largest halving whose working set fits' must use the budget
    the verdict checks (92% of it), else the plan stops at a micro-batch it then refuses."""
    whole = make_plan(tiny, tokens_per_step=65536, micro_tokens=65536)
    limit = int(whole.device_bytes / 0.96)   # fits 100% of it, not 92%
    p = make_plan(tiny, tokens_per_step=65536, gpu_limit=limit)
    assert p.fits_device and p.micro_tokens < 65536


def test_micro_batch_is_never_larger_than_the_step(tiny):
    p = make_plan(tiny, tokens_per_step=1024, micro_tokens=4096)
    q = make_plan(tiny, tokens_per_step=1024, micro_tokens=1024)
    assert p.micro_tokens == 1024 and p.device_work_bytes == q.device_work_bytes


def test_plan_refusal_names_plan_flags(capsys):
    rc, out, _ = _plan(capsys, "--model", "tiny", "--gpu-memory", "7MiB", "--micro-tokens",
                       "1024", "--host-memory", "1GiB")
    why = out.strip().splitlines()[-1]
    assert rc == 1 and why.startswith("why:")
    assert "--micro-tokens" in why and "--micro-batch-size" not in why, why
    rc, out, _ = _plan(capsys, "--model", "7b", "--gpu-memory", "24GiB", "--host-memory",
                       "120GiB", "--tokens-per-step", str(1 << 20))
    why = out.strip().splitlines()[-1]
    assert rc == 1 and "--tokens-per-step" in why and "--batch-size" not in why, why


@pytest.mark.parametrize("flag", ["--gpu-memory", "--host-memory"])
def test_a_size_without_unit_that_is_tiny_is_refused_with_a_hint(capsys, flag):
    """'24' is 24 bytes: a budget no model fits, which the plan called DOES NOT FIT with
    hints about micro-batches; say the unit is missing instead."""
    rc, out, err = _plan(capsys, "--model", "tiny", flag, "24")
    assert rc == 2 and out == ""
    assert "24 bytes" in _one_line(err) and "24GiB" in err
    # with a unit, or a byte count of a real size, it is taken as before
    assert _plan(capsys, "--model", "tiny", flag, "24GB")[0] == 0
    assert _plan(capsys, "--model", "tiny", flag, str(24 * GiB))[0] == 0


def test_held_updates_without_clipping_name_the_plan_flags(capsys):
    rc, _, err = _plan(capsys, "--model", "tiny", "--held-gpu-updates", "2", "--no-clip")
    assert rc == 2 and "--no-clip" in _one_line(err) and "--held-gpu-updates" in err


def test_host_copies_with_fp32_compute_are_refused_as_train_refuses_them(capsys):
    """`train --host-weight-copy cast --compute-dtype float32` is refused by the engine; the
    plan silently planned without the copies it was asked for."""
    rc, out, err = _plan(capsys, "--model", "tiny", "--host-weight-copy", "on",
                         "--compute-dtype", "float32")
    assert rc == 2 and out == "" and "--compute-dtype bfloat16" in _one_line(err)


def test_a_negative_size_is_one_line_that_says_how_to_pass_it(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "tiny", "--gpu-memory", "-1GiB"])
    assert e.value.code == 2
    err = _one_line(capsys.readouterr().err.strip())
    assert "expected one argument" in err and "--gpu-memory=" in err


@pytest.mark.parametrize("model,hint", [("7B", "did you mean '7b'"),
                                        ("./no/such/dir", "no such directory")])
def test_a_model_that_does_not_exist_says_what_to_pass(capsys, model, hint):
    rc, _, err = _plan(capsys, "--model", model)
    assert rc == 2 and hint in _one_line(err)


def test_train_plans_12_bytes_a_param_where_updates_are_not_held(monkeypatch):
    """`--max-grad-norm 0 --no-skip-nonfinite` holds no gradients (12 B/param and a few
    staged blocks), but train's check planned 16 B/param and refused runs that fit."""
    from outcore import planner, train
    from outcore.config import TrainConfig
    from outcore.errors import OutcoreError
    s = model_shape("125m")
    tokens = 16 * 256
    kw = dict(tokens_per_step=tokens, micro_tokens=tokens, compute_itemsize=4)   # the CPU's
    free, held = make_plan(s, clip=False, **kw), make_plan(s, clip=True, **kw)
    assert free.host_need_bytes < held.host_need_bytes
    monkeypatch.setattr(planner, "host_available", lambda: free.host_need_bytes)
    cfg = TrainConfig(model="125m", device="cpu", max_grad_norm=0.0, skip_nonfinite=False)
    plan = train.check_plan(cfg.validate(), "cpu")
    assert plan.host_bytes_per_param == 12 and plan.fits
    with pytest.raises(OutcoreError, match="refusing to start"):   # held: 16 B/param
        train.check_plan(TrainConfig(model="125m", device="cpu").validate(), "cpu")


def test_the_model_line_adds_up_for_a_small_model(tiny):
    """'0.2M params = 4 blocks of 0.05M + 0.03M' (0.23M): under a million the counts are
    printed whole, so the sum on the line holds."""
    line = make_plan(tiny, tokens_per_step=1024).lines()[0]
    m = re.match(r"model tiny: ([\d,]+) params = (\d+) blocks of ([\d,]+) \+ ([\d,]+) resident",
                 line)
    assert m, line
    total, n, block, rest = (int(g.replace(",", "")) for g in m.groups())
    assert total == n * block + rest == tiny.params


def test_a_reader_that_goes_away_is_no_traceback(tmp_path):
    """`outcore plan ... | head -1`: the plan's lines met a closed pipe and Python printed a
    BrokenPipeError traceback."""
    import os
    import subprocess
    import sys
    r, w = os.pipe()
    os.close(r)   # the reader is gone before the first line
    try:
        p = subprocess.run([sys.executable, "-m", "outcore.cli", "plan", "--no-calibrate",
                            "--model", "tiny"], stdout=w, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr
    assert p.returncode == 141
