"""Tiny models of every family the engine accepts, for the equivalence tests."""

import torch
from torch import nn

from outcore.models import decoder


def hf(name: str):
    import transformers as T
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            attention_bias=True))
    if name == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    if name == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(
            vocab_size=96, n_embd=32, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    raise KeyError(name)


class ListModel(nn.Module):
    """A custom model whose blocks are an nn.ModuleList at `trunk`; returns a tensor."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.trunk = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(4))
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.trunk:
            h = h + blk(h)
        return self.out(h)


def sequential():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 3))


def make(name: str):
    if name == "decoder":
        return decoder("tiny", vocab=96, max_seq=64)
    if name == "list":
        return ListModel()
    if name == "sequential":
        return sequential()
    return hf(name)


def batch_for(name: str, gen: torch.Generator, rows: int = 5):
    if name in ("list", "sequential"):
        key = "x" if name == "list" else "input"  # nn.Sequential.forward(input)
        return {key: torch.randn(rows, 8, generator=gen),
                "y": torch.randint(0, 3, (rows,), generator=gen)}
    x = torch.randint(0, 96, (rows, 12), generator=gen)
    labels = x.clone()
    labels[:2, :4] = -100  # uneven label counts per row: the mean must weight by tokens
    return {"input_ids": x, "labels": labels}


def loss_fn_for(name: str):
    if name in ("list", "sequential"):
        return lambda out, b: nn.functional.cross_entropy(out, b["y"])
    return None


def blocks_for(name: str):
    return {"list": "trunk"}.get(name)
