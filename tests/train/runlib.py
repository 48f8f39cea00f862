"""Shared by the train review tests: a tiny CPU run's TrainConfig (the corpus fixture is
in conftest.py)."""

from outcore import train
from outcore.config import TrainConfig


def tiny_cfg(out, corpus, **kw) -> TrainConfig:
    """A 'tiny' model on `corpus`, 4 steps of 4 x 32 tokens on the CPU, a checkpoint every
    2 steps; kw overrides."""
    base = dict(model="tiny", data=str(corpus), seq_len=32, batch_size=4, max_steps=4,
                warmup_steps=1, output_dir=str(out), tensorboard=False, device="cpu",
                generate_tokens=0, save_every=2)
    return TrainConfig(**{**base, **kw})


def finished_run(tmp_path_factory, cfg_of):
    """A finished run's directory: cfg_of(out) trained to its end (checkpoints every 2
    steps and final/)."""
    out = tmp_path_factory.mktemp("done") / "run"
    train.run(cfg_of(out))
    return out
