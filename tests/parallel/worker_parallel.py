"""One rank of a test job: python worker_parallel.py '<json config>' (env from the test)."""

import json
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import outcore  # noqa: E402
from outcore.models import decoder  # noqa: E402
from outcore.parallel import init_distributed, shutdown  # noqa: E402
from tests.stream.models import batch_for, blocks_for, loss_fn_for, make  # noqa: E402

LR, EPS, WD = 3e-3, 1e-6, 0.1


def build(cfg: dict):
    """The test's model; "lazy": the tiny decoder on the meta device (materialize.py)."""
    if cfg.get("lazy"):
        return decoder("tiny", vocab=96, max_seq=64, lazy=True)
    return make(cfg["family"])


def main(cfg: dict) -> None:
    init_distributed(backend="gloo", heartbeat_s=cfg.get("heartbeat", 20))
    rank = torch.distributed.get_rank()
    fam = cfg["family"]
    torch.manual_seed(1)
    model = build(cfg)
    gen = torch.Generator().manual_seed(2)
    batches = [batch_for(fam, gen, rows=cfg["rows"]) for _ in range(cfg["steps"])]
    kw = dict(device="cpu", micro_batch_size=cfg.get("micro"), max_grad_norm=cfg.get("clip"),
              blocks=blocks_for(fam), distributed=True, shares=cfg.get("shares"))
    opt = outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD)
    out = {"losses": [], "rows": []}
    if cfg.get("try_copies"):   # refused before anything collective: a one-line error
        try:
            outcore.Engine(model, optimizer=opt, host_weight_copy="fused", **kw)
        except outcore.OutcoreError as e:
            out["copy_error"] = str(e)
    engine = outcore.Engine(model, optimizer=opt, **kw)
    out["signalled"] = []   # engine.step_count when this rank's SIGINT handler ran
    signal.signal(signal.SIGINT, lambda *_: out["signalled"].append(engine.step_count))
    for i, b in enumerate(batches):
        if cfg.get("kill_rank") == rank and i == cfg.get("kill_step", 1):
            os.kill(os.getpid(), signal.SIGKILL)
        if cfg.get("signal_rank") == rank and i == cfg.get("signal_step", 1):
            os.kill(os.getpid(), signal.SIGINT)   # this rank only, before its step i
        out["losses"].append(engine.train_step(b, loss_fn=loss_fn_for(fam)))
        out["rows"].append(engine.stats.history[-1]["rows"])
        if cfg.get("save_at") == i + 1:
            engine.save(cfg["ckpt"])
    out["params"] = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    out["host_bytes"] = engine.host.bytes() + engine.opt.state_bytes()
    out["state_bytes"] = sum(m.numel() * 4 for m in engine.host.master) + \
        engine.opt.state_bytes()
    out["padded"] = sum(engine.host.padded)
    out["shares"] = engine.meter.history
    if cfg.get("save_at"):  # resume in a fresh engine from the checkpoint, finish the run
        engine.close()
        torch.manual_seed(1)
        fresh = build(cfg)
        e2 = outcore.Engine.load(cfg["ckpt"], fresh, **kw)
        out["resumed_losses"] = [e2.train_step(b, loss_fn=loss_fn_for(fam))
                                 for b in batches[e2.step_count:]]
        out["resumed_params"] = {n: p.detach().clone()
                                 for n, p in e2.model.named_parameters()}
        e2.close()
    else:
        engine.close()
    torch.save(out, f"{cfg['out']}.{rank}")
    shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
