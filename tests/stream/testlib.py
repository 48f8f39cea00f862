"""Helpers shared by the engine's misuse and review tests: one-line errors, a loss, an
engine with fixed AdamW settings on the CPU."""

from torch import nn

import outcore

LR, EPS, WD = 3e-3, 1e-6, 0.1


def one_line(e) -> str:
    """The message of a pytest.raises excinfo, asserted to be one short line."""
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


def ce(out, batch):
    return nn.functional.cross_entropy(out, batch["y"])


def engine(model, **kw):
    """outcore.Engine on the CPU with AdamW(lr=LR, eps=EPS, weight_decay=WD)."""
    return outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                          device="cpu", **kw)
