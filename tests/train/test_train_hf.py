"""HF checkpoints in and out: shard-by-shard load, train with the CLI loop, reload, same logits."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
import transformers as tf  # noqa: E402

from outcore import train  # noqa: E402
from outcore.cli import main  # noqa: E402
from outcore.config import TrainConfig  # noqa: E402
from outcore.hf import load_hf  # noqa: E402

from .hfutil import SENTENCES, make_checkpoint  # noqa: E402


@pytest.fixture
def corpus(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("\n".join(SENTENCES * 3))
    return f


def test_sharded_bf16_checkpoint_loads_as_fp32(tmp_path):
    src = make_checkpoint("llama", tmp_path / "src")
    ref = tf.AutoModelForCausalLM.from_pretrained(str(src))
    ref.to(torch.bfloat16).save_pretrained(str(tmp_path / "sh"), max_shard_size="20KB")
    assert len(list((tmp_path / "sh").glob("*.safetensors"))) > 2  # really several shards
    model, tok = load_hf(str(tmp_path / "sh"))
    assert tok is None  # no tokenizer files copied: the CLI refuses such a dir
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.dtype == torch.float32, n
        assert torch.equal(p, q.to(torch.bfloat16).float()), n


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_train_then_transformers_reload_same_logits(tmp_path, corpus, kind):
    src = make_checkpoint(kind, tmp_path / "src")
    out = tmp_path / "run"
    cfg = TrainConfig(model=str(src), data=str(corpus), seq_len=16, batch_size=4, max_steps=3,
                      lr=1e-2, warmup_steps=0, output_dir=str(out), tensorboard=False,
                      device="cpu", save_every=2)
    s = train.run(cfg, return_model=True)
    ours = s["model"]
    assert s["steps"] == 3
    for ck in (out / "final", out / "checkpoints" / "step-00000002"):
        back = tf.AutoModelForCausalLM.from_pretrained(str(ck))
        tok = tf.AutoTokenizer.from_pretrained(str(ck))
        ids = torch.tensor([tok(SENTENCES[0])["input_ids"]])
        if ck.name == "final":
            want = ours(input_ids=ids).logits
            got = back(input_ids=ids).logits
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
            init = tf.AutoModelForCausalLM.from_pretrained(str(src))
            assert not torch.allclose(init(input_ids=ids).logits, want)  # it did train
        else:
            assert back.config.vocab_size == len(tok)
    if kind == "gpt2":  # tied weights stay tied through the round trip
        assert back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr()


def test_cli_refuses_checkpoint_without_tokenizer(tmp_path, corpus, capsys):
    src = make_checkpoint("llama", tmp_path / "src")
    for f in src.glob("tokenizer*"):
        f.unlink()
    capsys.readouterr()
    rc = main(["train", "--model", str(src), "--data", str(corpus), "--max-steps", "1",
               "--output-dir", str(tmp_path / "o"), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "has no tokenizer files" in err and len(err.splitlines()) == 1


def test_empty_model_allocates_no_parameters(tmp_path):
    """The shard-by-shard load starts from a model whose parameters take no memory."""
    from outcore.hf import empty_model
    cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=8, num_attention_heads=16)
    cfg.save_pretrained(str(tmp_path))
    m = empty_model(str(tmp_path))  # ~0.5B params: 2 GB if it were materialised
    params = list(m.parameters())
    assert sum(p.numel() for p in params) > 4e8
    assert all(p.device.type == "meta" for p in params)


def test_compile_kernels_is_for_reference_sizes(tmp_path, capsys):
    """--compile-kernels builds the reference decoder with compiled kernels; with a Hugging
    Face checkpoint (whose code outcore does not own) it is a one-line error."""
    model, _, _ = train.build_model(TrainConfig(model="tiny", compile_kernels=True))
    assert model.cfg.compiled
    assert not train.build_model(TrainConfig(model="tiny"))[0].cfg.compiled
    src = make_checkpoint("llama", tmp_path / "src")
    capsys.readouterr()
    rc = main(["train", "--model", str(src), "--compile-kernels", "--max-steps", "1",
               "--output-dir", str(tmp_path / "o"), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--compile-kernels applies to the reference sizes only" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_lazy_checkpoint_fills_the_engine_as_load_hf_does(tmp_path, kind):
    """lazy_hf: parameters on the meta device, read from the shards by Engine(init=...):
    the engine's weights are load_hf's, tied ones stay tied; a missing tensor or a wrong
    shape is a one-line error."""
    import outcore
    from outcore.errors import OutcoreError
    from outcore.hf import lazy_hf
    src = make_checkpoint(kind, tmp_path / "src")
    tf.AutoModelForCausalLM.from_pretrained(str(src)).save_pretrained(
        str(tmp_path / "sh"), max_shard_size="20KB")
    want, _ = load_hf(str(tmp_path / "sh"))
    model, _, init = lazy_hf(str(tmp_path / "sh"))
    assert all(p.is_meta for p in model.parameters())
    eng = outcore.Engine(model, device="cpu", init=init)
    got = dict(eng.model.named_parameters())
    for n, p in want.named_parameters():
        assert torch.equal(got[n], p), n
    if kind == "gpt2":
        assert eng.model.lm_head.weight is eng.model.transformer.wte.weight
    eng.close()
    from safetensors.torch import load_file, save_file
    shard = sorted((tmp_path / "sh").glob("*.safetensors"))[-1]
    tensors = load_file(str(shard))
    key = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != key}, str(shard),
              metadata={"format": "pt"})
    with pytest.raises(OutcoreError, match="the safetensors files lack 1 parameters"):
        lazy_hf(str(tmp_path / "sh"))
    tensors[key] = torch.zeros(3, 5)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    model, _, init = lazy_hf(str(tmp_path / "sh"))
    with pytest.raises(OutcoreError, match=r"has shape \(3, 5\), the config says"):
        outcore.Engine(model, device="cpu", init=init)
