"""Review of the reference decoder and the Hugging Face interop: numerics against
transformers' Llama, configs refused in one line, checkpoints transformers renames or merges."""

import importlib
import json

import pytest
import torch

from outcore.errors import OutcoreError
from outcore.models import decoder

tf = pytest.importorskip("transformers")

LLAMA_NAMES = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj",
               "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
               "mlp_norm": "post_attention_layernorm", "w1": "mlp.gate_proj",
               "w3": "mlp.up_proj", "w2": "mlp.down_proj"}
TOP_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}


def _hf_name(n):
    if n in TOP_NAMES:
        return TOP_NAMES[n]
    _, i, mod, leaf = n.split(".")
    return f"model.layers.{i}.{LLAMA_NAMES[mod]}.{leaf}"


@pytest.mark.parametrize("kw", [{}, {"kv_heads": 4, "tie_embeddings": True},
                                {"rope_theta": 5e5, "norm_eps": 1e-2}])
def test_decoder_matches_transformers_llama(kw):
    """Same weights (norms perturbed off 1) -> the same logits and shifted-label loss as
    LlamaForCausalLM: rotary layout, GQA, causality, RMSNorm eps, tied head."""
    torch.manual_seed(0)
    m = decoder("tiny", layers=2, **kw)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    c = m.cfg
    ref = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=c.vocab, hidden_size=c.dim, intermediate_size=c.ffn,
        num_hidden_layers=c.layers, num_attention_heads=c.heads, num_key_value_heads=c.kv_heads,
        max_position_embeddings=c.max_seq, rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps,
        tie_word_embeddings=c.tie_embeddings, attn_implementation="eager"))
    ref.load_state_dict({_hf_name(n): p for n, p in m.state_dict().items()})
    ids = torch.randint(0, c.vocab, (2, 24))
    labels = ids.clone()
    labels[0, 5:9] = -100
    torch.testing.assert_close(m(ids).logits, ref(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m(ids, labels=labels).loss,
                               ref(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [{"heads": 3}, {"heads": 5}, {"kv_heads": 3}, {"kv_heads": 8},
                                {"heads": 64, "kv_heads": 64}, {"dim": 0}, {"vocab": 0},
                                {"layers": -1}, {"layers": 0}, {"ffn": 0}, {"heads": 0},
                                {"dim": 64.0}, {"max_seq": -4}, {"norm_eps": -1.0},
                                {"rope_theta": 0.0}, {"rope_theta": float("nan")}])
def test_decoder_config_refuses_nonsense(kw):
    """Sizes that cannot make a model were accepted and crashed inside torch at the first
    forward (or ran: layers=-1, ffn=0, norm_eps<0 -> NaN), or made num_params negative."""
    with pytest.raises(OutcoreError) as e:
        decoder("tiny", lazy=True, **kw)
    assert "\n" not in str(e.value) and "DecoderConfig" in str(e.value)


def test_decoder_refuses_misshapen_inputs():
    m = decoder("tiny", layers=1)
    ids = torch.randint(0, 256, (2, 8))
    for args in [(ids[0],), (ids, ids[:, :7]), (ids, ids[0])]:
        with pytest.raises(OutcoreError, match="input_ids must be B x T"):
            m(*args)
    assert m(ids, labels=ids).loss.isfinite()


def test_lazy_tied_decoder_stays_tied():
    m = decoder("tiny", lazy=True, tie_embeddings=True)
    assert m.head.weight is m.embed.weight and m.embed.weight.is_meta
    assert sum(p.numel() for p in m.parameters()) == m.cfg.num_params()


def _tiny(cfg, out):
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(out))
    return out


def test_gpt_neox_checkpoint_loads(tmp_path):
    """transformers 5 names GPT-NeoX's head lm_head and renames the checkpoint's embed_out as
    it loads (save_pretrained writes embed_out back): load_hf said the checkpoint lacked
    lm_head.weight."""
    from outcore.hf import lazy_hf, load_hf
    src = _tiny(tf.GPTNeoXConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 max_position_embeddings=64, tie_word_embeddings=False),
                tmp_path / "neox")
    ref = tf.AutoModelForCausalLM.from_pretrained(str(src)).eval()
    got, _ = load_hf(str(src))
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    torch.testing.assert_close(got.eval()(input_ids=ids).logits, ref(input_ids=ids).logits,
                               rtol=0, atol=0)
    model, _, init = lazy_hf(str(src))
    t = torch.empty(model.lm_head.weight.shape)
    init("lm_head.weight", t)
    assert torch.equal(t, ref.lm_head.weight)


def test_merged_expert_checkpoint_is_a_clear_error(tmp_path):
    """Mixtral: transformers stacks the per-expert tensors into one parameter as it loads;
    the loader said 'is the checkpoint complete?' of a complete checkpoint."""
    from outcore.hf import load_hf
    src = _tiny(tf.MixtralConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2, num_local_experts=2,
                                 num_experts_per_tok=1), tmp_path / "moe")
    with pytest.raises(OutcoreError, match="by merging several checkpoint tensors") as e:
        load_hf(str(src))
    assert "\n" not in str(e.value)


def test_invalid_hf_config_is_one_line(tmp_path):
    """transformers 5 validates configs with huggingface_hub's strict dataclasses, whose
    errors are neither OSError nor ValueError: a traceback from hf_config, empty_model
    (outcore plan) and load_tokenizer (train.build_model)."""
    from outcore.hf import empty_model, load_tokenizer
    tf.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=4).save_pretrained(str(tmp_path))
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "num_attention_heads": 3}))
    for fn in (empty_model, load_tokenizer):
        with pytest.raises(OutcoreError, match=r"not a multiple of the number of attention "
                           r"heads \(3\)") as e:
            fn(str(tmp_path))
        assert "\n" not in str(e.value)


def test_pad_id_outside_vocab_is_one_line(tmp_path):
    """An AssertionError from nn.Embedding(padding_idx=...) escaped empty_model."""
    from outcore.hf import empty_model
    tf.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=4, pad_token_id=300).save_pretrained(str(tmp_path))
    with pytest.raises(OutcoreError, match="config.json does not build a model"):
        empty_model(str(tmp_path))


def test_sampling_a_compiled_model_compiles_nothing(monkeypatch):
    """train's sample grows the sequence a token at a time: with compiled kernels
    (dynamic=False) each length was a new compile, seconds a token and torch's recompile
    warnings after a CPU run with --compile-kernels. It runs the eager functions."""
    from outcore import train
    from outcore.data import ByteTokenizer
    from outcore.models import kernels
    # the module (the package's `decoder` attribute is the function of that name)
    decoder_module = importlib.import_module("outcore.models.decoder")

    def no_compile(*a, **k):
        raise AssertionError("torch.compile called while sampling")
    monkeypatch.setattr(kernels.torch, "compile", no_compile)
    # fresh lazily-compiled kernels: other tests may have compiled the shared ones already
    monkeypatch.setattr(decoder_module, "_KERNELS", {c: kernels.Kernels(compiled=c)
                                                     for c in (False, True)})
    torch.manual_seed(0)
    model = decoder("tiny", layers=1, compiled=True)
    text = train.generate(model, ByteTokenizer(), "def ", 4)
    assert isinstance(text, str) and text.startswith("def ")
    with pytest.raises(AssertionError, match="torch.compile called"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))   # outside: compiled as before
