"""Review of `outcore train`'s configuration: keys a TOML file would silently drop, values
that were taken without a check, and where each one's error is (one line, before a run)."""

import pytest

from outcore.cli import main
from outcore.config import build, load_toml
from outcore.errors import OutcoreError


def _toml(tmp_path, text):
    f = tmp_path / "c.toml"
    f.write_text(text)
    return f


def _one_line(e) -> str:
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def test_a_key_above_the_train_table_is_not_dropped(tmp_path):
    """`lr = 0.1` before `[train]` is a top-level key, which the loader dropped without a
    word once a [train] table existed."""
    f = _toml(tmp_path, "lr = 0.1\n[train]\nseed = 1\n")
    with pytest.raises(OutcoreError, match="'lr' is outside the \\[train\\] table") as e:
        load_toml(f)
    assert "move it under [train]" in _one_line(e)
    f = _toml(tmp_path, "[train]\nseed = 1\n[optimizer]\nlr = 0.1\n")
    with pytest.raises(OutcoreError, match="'optimizer' is outside the \\[train\\] table"):
        load_toml(f)


def test_a_key_given_twice_in_two_spellings_is_refused(tmp_path):
    f = _toml(tmp_path, "[train]\nseq-len = 64\nseq_len = 32\n")
    with pytest.raises(OutcoreError, match="'seq-len' and 'seq_len' are the same key") as e:
        load_toml(f)
    _one_line(e)


def test_a_json_config_says_that_the_file_must_be_toml(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"train": {"lr": 0.1}}\n')
    with pytest.raises(OutcoreError, match="line 1") as e:
        load_toml(f)
    assert "TOML, not JSON" in _one_line(e) and "lr = 0.001" in str(e.value)


def test_held_gpu_updates_takes_a_number_as_the_flag_does(tmp_path):
    """--held-gpu-updates 4 is a flag value; `held_gpu_updates = 4` in the file was refused
    as 'must be a string'."""
    assert build(load_toml(_toml(tmp_path, "[train]\nheld_gpu_updates = 4\n")), {}) \
        .held_gpu_updates == "4"
    for bad in ("true", "2.5"):
        with pytest.raises(OutcoreError, match="held_gpu_updates"):
            build(load_toml(_toml(tmp_path, f"[train]\nheld_gpu_updates = {bad}\n")), {})


@pytest.mark.parametrize("key", ["data", "output_dir", "model"])
def test_empty_strings_are_refused(key):
    """output_dir = "" wrote the run (final/, metrics, config.json) into the current
    directory; data = "" trained on the built-in corpus instead of the user's data."""
    with pytest.raises(OutcoreError, match=f"{key}='' is empty") as e:
        build({}, {key: ""})
    _one_line(e)


@pytest.mark.parametrize("seed", [2 ** 64, -(2 ** 63) - 1, 10 ** 23])
def test_a_seed_out_of_64_bits_is_one_line(seed, tmp_path, capsys):
    with pytest.raises(OutcoreError, match="seed=.* 64 bits") as e:
        build({}, {"seed": seed})
    _one_line(e)
    # through the CLI it was a traceback from torch.manual_seed
    rc = main(["train", "--model", "tiny", "--device", "cpu", "--seed", str(seed),
               "--output-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--seed " in err and len(err.splitlines()) == 1, err


def test_a_negative_max_grad_norm_is_refused_not_taken_as_no_clipping():
    """-1 turned clipping off without a word (the engine itself refuses max_grad_norm=-1)."""
    with pytest.raises(OutcoreError, match="max_grad_norm=-1.0 .*0: no clipping"):
        build({}, {"max_grad_norm": -1.0})
    assert build({}, {"max_grad_norm": 0.0}).max_grad_norm is None   # documented: none


@pytest.mark.parametrize("key,value", [("max_data_bytes", 0), ("max_data_bytes", -1),
                                       ("generate_tokens", -5)])
def test_config_only_counts_are_checked(key, value):
    with pytest.raises(OutcoreError, match=key):
        build({}, {key: value})


@pytest.mark.parametrize("value,ok", [("24", False), ("24GiB", True), ("1e9", True),
                                      ("lots", False)])
def test_gpu_memory_is_checked_with_the_config(value, ok):
    """A budget that does not parse, or '24' (24 bytes), was taken by the config and only
    refused (or ignored, on the CPU) later."""
    if ok:
        assert build({}, {"gpu_memory": value}).gpu_memory == value
        return
    with pytest.raises(OutcoreError, match="gpu_memory") as e:
        build({}, {"gpu_memory": value})
    _one_line(e)


@pytest.mark.parametrize("key,flag", [("nproc", "--nproc N"), ("config", "--config FILE")])
def test_flags_that_are_not_config_keys_say_so(tmp_path, key, flag):
    """The README has every train flag as a [train] key; --nproc and --config are not: the
    error listed the valid keys instead of saying where the option goes."""
    f = _toml(tmp_path, f"[train]\n{key} = 2\n")
    with pytest.raises(OutcoreError, match=f"'{key}' is a command-line option only") as e:
        load_toml(f)
    assert flag in _one_line(e)


@pytest.mark.parametrize("key,flag,value", [("tensorboard", "--tensorboard", True),
                                            ("skip_nonfinite", "--skip-nonfinite", True),
                                            ("keep_weights", "--keep-weights", True),
                                            ("compile_kernels", "--no-compile-kernels", False),
                                            ("resume", "--no-resume", False)])
def test_a_flag_switches_back_what_a_config_file_switched(tmp_path, key, flag, value):
    """Flags win over the file: each on/off setting has both flags (a file's
    `tensorboard = false` could not be turned back on from the command line)."""
    from outcore.cli import build_parser
    f = _toml(tmp_path, f"[train]\n{key} = {str(not value).lower()}\n")
    args = build_parser().parse_args(["train", "--config", str(f), flag])
    flags = {k: v for k, v in vars(args).items()
             if k not in ("func", "config", "command", "nproc", "argv")}
    assert getattr(build(load_toml(f), flags), key) is value
    assert getattr(build(load_toml(f), {}), key) is (not value)
