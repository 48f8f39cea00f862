"""The CLI's edges: unknown flags and config keys, bad values, `outcore plan`, refusal."""

import time

import pytest

from outcore.cli import main
from outcore.config import build, load_toml
from outcore.errors import OutcoreError


def _err(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_unknown_flag_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--max-stepz", "3"])
    assert e.value.code == 2
    assert "unrecognized arguments: --max-stepz" in _err(capsys)
    with pytest.raises(SystemExit):
        main(["train", "--grad-accum", "two"])
    assert "invalid int value" in _err(capsys)


def test_unknown_and_mistyped_config_keys(tmp_path, capsys):
    f = tmp_path / "c.toml"
    f.write_text("[train]\nmax_step = 3\n")
    assert main(["train", "--config", str(f)]) == 2
    assert "unknown config key 'max_step'" in _err(capsys)
    f.write_text("[train]\nseq_len = 'long'\n")
    assert main(["train", "--config", str(f)]) == 2
    assert "'seq_len' must be an integer" in _err(capsys)
    f.write_text("[train]\nseq-len = 64\nlr = 1\ngrad_accum = 2\n")
    cfg = build(load_toml(f), {"seq_len": 32})
    assert (cfg.seq_len, cfg.lr, cfg.grad_accum) == (32, 1.0, 2)  # flags win over the file
    with pytest.raises(OutcoreError, match="grad_accum=0 must be >= 1"):
        build({}, {"grad_accum": 0})


def test_no_skip_nonfinite_flag_and_key(tmp_path):
    from outcore.cli import build_parser
    args = build_parser().parse_args(["train", "--no-skip-nonfinite", "--max-grad-norm", "0"])
    flags = {k: v for k, v in vars(args).items() if k not in ("func", "config", "command",
                                                                "nproc")}
    cfg = build({}, flags)
    assert cfg.skip_nonfinite is False and cfg.max_grad_norm is None
    assert build({}, {}).skip_nonfinite is True
    f = tmp_path / "c.toml"
    f.write_text("[train]\nskip_nonfinite = false\n")
    assert build(load_toml(f), {}).skip_nonfinite is False


def test_plan_fits_and_does_not_fit(capsys):
    rc = main(["plan", "--model", "7b", "--gpu-memory", "24GiB", "--host-memory", "256GiB",
               "--tokens-per-step", "65536", "--micro-tokens", "4096", "--no-calibrate"])
    out = capsys.readouterr().out
    assert rc == 0 and "verdict: fits" in out
    assert "16 B/param" in out and "6,738.4M params" in out
    rc = main(["plan", "--model", "70b", "--gpu-memory", "24GiB", "--host-memory", "256GiB",
               "--no-calibrate"])
    out = capsys.readouterr().out
    assert rc == 1 and "DOES NOT FIT" in out and "1.0 TiB of host memory" in out


def test_plan_calibrates_a_step_time(capsys):
    assert main(["plan", "--model", "tiny", "--tokens-per-step", "2048", "--device", "cpu",
                 "--host-memory", "1GiB", "--compute-dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "calibration (cpu): matmul" in out and "tokens/s; bound by" in out


def test_plan_numbers_match_the_formula():
    from outcore.models import SIZES
    from outcore.planner import make_plan, model_shape
    s = model_shape("125m")
    assert s.params == SIZES["125m"].num_params()
    p = make_plan(s, tokens_per_step=1024, host_limit=None, clip=False)
    # without clipping, up to Engine.max_staged_grads blocks' gradients wait for the CPU
    from outcore.stream.engine import STAGED_GRADS
    staged = min(STAGED_GRADS, s.layers) * s.block_params * 4
    assert p.host_state_bytes == 12 * s.params + staged and p.fits
    assert "of gradients waiting for the CPU AdamW" in "\n".join(p.lines())
    held = make_plan(s, tokens_per_step=1024, host_limit=None, clip=True, host_copy=True)
    assert held.host_bytes_per_param == 18
    assert "held gradients 4 for clipping + 16-bit weight copies 2" in "\n".join(held.lines())
    assert "held gradients" not in "\n".join(p.lines())


def test_train_refuses_before_allocating(tmp_path, capsys):
    t = time.perf_counter()
    rc = main(["train", "--model", "70b", "--device", "cpu", "--output-dir", str(tmp_path)])
    assert rc == 2
    err = _err(capsys)
    assert "refusing to start" in err and "host memory (16 B/param)" in err
    assert time.perf_counter() - t < 20  # nothing large was built
    assert not any(tmp_path.iterdir())


def test_no_keep_weights_flag_and_key(tmp_path):
    from outcore.cli import build_parser
    args = build_parser().parse_args(["train", "--no-keep-weights"])
    flags = {k: v for k, v in vars(args).items() if k not in ("func", "config", "command",
                                                                "nproc")}
    assert build({}, flags).keep_weights is False
    assert build({}, {}).keep_weights is True
    f = tmp_path / "c.toml"
    f.write_text("[train]\nkeep_weights = false\n")
    assert build(load_toml(f), {}).keep_weights is False
    f.write_text("[train]\nkeep_weights = 'no'\n")
    with pytest.raises(OutcoreError, match="keep_weights"):
        build(load_toml(f), {})


def test_host_weight_copy_flag_and_key(tmp_path):
    from outcore.cli import build_parser
    from outcore.config import COPY_MODES
    assert build({}, {}).host_weight_copy == "auto"
    args = build_parser().parse_args(["train", "--host-weight-copy", "off"])
    flags = {k: v for k, v in vars(args).items() if k not in ("func", "config", "command",
                                                                "nproc")}
    assert COPY_MODES[build({}, flags).host_weight_copy] is False
    f = tmp_path / "c.toml"
    f.write_text("[train]\nhost_weight_copy = 'cast'\n")
    assert COPY_MODES[build(load_toml(f), {}).host_weight_copy] is True
    f.write_text("[train]\nhost_weight_copy = true\n")
    with pytest.raises(OutcoreError, match="'host_weight_copy' must be a string"):
        build(load_toml(f), {})
    f.write_text("[train]\nhost_weight_copy = 'always'\n")
    with pytest.raises(OutcoreError, match="host_weight_copy='always': use auto, fused"):
        build(load_toml(f), {})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--host-weight-copy", "yes"])
