"""Tiny Hugging Face checkpoints (Llama, GPT-2) with a tokenizer built offline."""

from __future__ import annotations

from pathlib import Path

import torch

SENTENCES = ["the quick brown fox jumps over the lazy dog",
             "a journey of a thousand miles begins with a single step",
             "to be or not to be that is the question"] * 4


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def make_checkpoint(kind: str, out: Path, seed: int = 0) -> Path:
    """Write a tiny `kind` ('llama' or 'gpt2') checkpoint + tokenizer to out; returns out."""
    import transformers as tf
    torch.manual_seed(seed)
    tok = make_tokenizer()
    vocab = len(tok)
    if kind == "llama":
        cfg = tf.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128, eos_token_id=tok.eos_token_id,
                             bos_token_id=tok.eos_token_id)
        model = tf.LlamaForCausalLM(cfg)
    else:
        cfg = tf.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                            eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = tf.GPT2LMHeadModel(cfg)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out
