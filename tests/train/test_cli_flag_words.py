"""Errors through the command line name its flags (--device cpu), not the Python API's
keywords (device='cpu'); a key a --config file set keeps the file's spelling."""

import torch

from outcore.cli import as_flags, main


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_engine_errors_name_the_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train", "--model", "tiny", "--device", "cuda", "--output-dir",
                 str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "--device cuda but CUDA is not available" in err and "use --device cpu" in err
    assert "device=" not in err
    assert main(["train", "--model", "tiny", "--device", "cpu", "--gpu-memory", "1KiB",
                 "--output-dir", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "gpu_memory" not in err and "--gpu-memory" in err, err


def test_a_config_files_key_keeps_its_spelling(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[train]\nmicro_batch_size = 0\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "micro_batch_size=0 must be >= 1" in _err(capsys)
    # the flag over the file: the flag's spelling
    assert main(["train", "--config", str(cfg), "--micro-batch-size", "-2"]) == 2
    assert "--micro-batch-size -2 must be >= 1" in _err(capsys)


def test_gemm_and_embed_errors_name_their_flags(tmp_path, capsys):
    assert main(["gemm", "--m", "8", "--n", "8", "--k", "8", "--devices", "cpu",
                 "--tile", "0"]) == 2
    assert "--tile 0 is not valid" in _err(capsys)
    edges = tmp_path / "e.txt"
    edges.write_text("0 1\n1 2\n")
    assert main(["embed", str(edges), "--chunk-size", "0", "--out",
                 str(tmp_path / "o.npy")]) == 2
    assert "--chunk-size 0 must be" in _err(capsys)


def test_rewrite_leaves_words_and_other_names_alone():
    names = {"device": "--device", "gpu_memory": "--gpu-memory", "eval_edges": "--edges"}
    assert as_flags("device='cuda:1' but only 1 GPU(s) exist", names) == \
        "--device cuda:1 but only 1 GPU(s) exist"
    assert as_flags("the device is busy; raise gpu_memory", names) == \
        "the device is busy; raise --gpu-memory"
    assert as_flags("engine.gpu_memory=5 and my_device=3", names) == \
        "engine.gpu_memory=5 and my_device=3"
    assert as_flags("eval_edges=['a', 'b'] unread", names) == "--edges ['a', 'b'] unread"
    assert as_flags("gpu_memory=1.0 KiB: too small", names) == "--gpu-memory 1.0 KiB: too small"
    assert as_flags("device='cpu'", {}) == "device='cpu'"


def _ranks_env(monkeypatch, rank: int, local: int):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", str(local))
    monkeypatch.delenv("OUTCORE_RANK_REPORTS", raising=False)


def test_plain_torchrun_prints_an_argument_error_once_a_node(capsys, monkeypatch):
    """Every rank meets a config mistake alike: each node's first rank says it, the others
    stay quiet (it was printed once per rank)."""
    from outcore.parallel.launch import REPORTS
    assert REPORTS == "OUTCORE_RANK_REPORTS"
    for rank, local, said in ((0, 0, True), (1, 1, False), (2, 0, True), (3, 1, False)):
        _ranks_env(monkeypatch, rank, local)
        assert main(["train", "--micro-batch-size", "0"]) == 2
        err = capsys.readouterr().err
        assert (err.strip() == "outcore: error: --micro-batch-size 0 must be >= 1") == said, err
        assert said or err == ""


def test_plain_torchrun_names_the_rank_of_a_later_error(capsys, monkeypatch):
    from outcore.cli import _say
    _ranks_env(monkeypatch, 3, 1)
    _say("outcore: error: the GPU is gone")
    assert capsys.readouterr().err.strip() == "[rank 3] outcore: error: the GPU is gone"


def test_plain_torchrun_prints_a_usage_mistake_once_a_node(capsys, monkeypatch):
    """argparse's own errors (an unknown flag) took another path that every rank printed."""
    import pytest
    for rank, local, said in ((0, 0, True), (1, 1, False)):
        _ranks_env(monkeypatch, rank, local)
        with pytest.raises(SystemExit) as e:
            main(["train", "--max-stepz", "3"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert ("unrecognized arguments: --max-stepz" in err) == said, err
        assert said or err == ""


def test_a_negated_flag_is_named_by_its_plain_form(tmp_path, capsys):
    """--no-skip-nonfinite and --skip-nonfinite share a dest: the fix is --skip-nonfinite
    (the error named the very flag the user had given)."""
    assert main(["train", "--model", "tiny", "--device", "cpu", "--held-gpu-updates", "2",
                 "--max-grad-norm", "0", "--no-skip-nonfinite",
                 "--output-dir", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "--skip-nonfinite" in err and "--no-skip-nonfinite" not in err, err


def test_a_torch_dtype_value_is_written_as_the_flag_takes_it(tmp_path, capsys):
    assert main(["train", "--model", "tiny", "--device", "cpu", "--host-weight-copy", "fused",
                 "--output-dir", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "--host-weight-copy fused keeps" in err and "--compute-dtype bfloat16" in err, err
    assert as_flags("use compute_dtype=torch.bfloat16", {"compute_dtype": "--compute-dtype"}) \
        == "use --compute-dtype bfloat16"
