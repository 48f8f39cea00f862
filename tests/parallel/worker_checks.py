"""One rank of test_parallel_checks.py: python worker_checks.py '<json config>'.

Runs the scenarios named in cfg["cases"] one after another in one job (a job costs
seconds of start-up on a small CI machine), each writing its result to
`{out}.{case}.{rank}` as soon as it ends, so an earlier result survives a later case that
hangs or aborts the job. A scenario returns a dict; an exception is recorded as its
one-line text under "raised".
"""

import copy
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import outcore  # noqa: E402
from outcore.parallel import init_distributed, shutdown  # noqa: E402
from tests.stream.models import batch_for, make  # noqa: E402
from tests.stream.test_equivalence import plain_steps  # noqa: E402

LR, EPS, WD = 3e-3, 1e-6, 0.1   # as tests.stream.test_equivalence (plain_steps)


def opt():
    return outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD)


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def ce(out, b):
    return nn.functional.cross_entropy(out, b["y"])


def mlp(width=16, norm=False):
    torch.manual_seed(1)
    mid = [nn.BatchNorm1d(width)] if norm else [nn.Tanh()]
    return nn.Sequential(nn.Linear(8, width), *mid, nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, 3))


def rows_batch(rows=6, seed=0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return {"input": torch.randn(rows, 8, generator=g) + shift,
            "y": torch.randint(0, 3, (rows,), generator=g)}


def one_line_error(fn):
    """fn() must raise OutcoreError: its message, else what happened instead."""
    try:
        fn()
    except outcore.OutcoreError as e:
        return str(e)
    except Exception as e:   # noqa: BLE001 - the test reports what it was
        return f"NOT OutcoreError: {type(e).__name__}: {e}"
    return "NOT RAISED"


# -- numerics ---------------------------------------------------------------------------
def case_masked_rank(cfg, rank, world, tmp):
    """A Hugging Face causal LM (mean over label tokens), shares 0.7/0.3 of 7 rows (5 + 2)
    and clipping; every label of the last 2 rows (all of rank 1's) is -100."""
    torch.manual_seed(1)
    model = make("gpt2")
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(2)
    batches = [batch_for("gpt2", gen, rows=7) for _ in range(2)]
    for b in batches:
        b["labels"][-2:] = -100
    e = outcore.Engine(model, optimizer=opt(), device="cpu", distributed=True,
                       shares=[0.7, 0.3], max_grad_norm=0.05)
    losses = [e.train_step(b) for b in batches]
    rows = [h["rows"] for h in e.stats.history]
    got = dict(e.model.named_parameters())
    want = plain_steps(ref, batches, None, 0.05)
    worst = max(rel(got[n].detach(), p.detach()) for n, p in ref.named_parameters())
    e.close()
    return {"losses": losses, "want": want, "rows": rows, "worst": worst}


def case_measured(cfg, rank, world, tmp):
    """measured shares on ranks of speeds 1:3 (each block sleeps 6 ms, or 2 ms, per row),
    the compute times read one step late as on a GPU (the timer holds back the newest
    step, as ComputeTimer.settled does until a step's events have run). The sleeps are
    long beside a step's fixed costs (collectives, on a loaded 2-core CI machine), which
    are the same on both ranks and pull the measured ratio towards 1:1 (3 ms / 1 ms gave
    rank 0 6 rows of 16 at step 3 in one CI run)."""
    per_row = 0.006 if rank == 0 else 0.002

    class Slow(nn.Linear):
        def forward(self, x):
            time.sleep(per_row * x.shape[0])
            return super().forward(x)

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 8), Slow(8, 8), Slow(8, 8), Slow(8, 8), nn.Linear(8, 3))
    e = outcore.Engine(model, optimizer=opt(), device="cpu", distributed=True,
                       shares="measured", measure_every=2)
    timer = e.timer
    real = timer.settled

    def late(block=False):   # every closed step but the newest, unless asked to block
        if block:
            return real(True)
        keep = timer._steps[-1:]
        del timer._steps[-1:]
        out = real(False)
        timer._steps[:] = keep
        return out
    timer.settled = late
    rows = []
    for i in range(9):
        e.train_step(rows_batch(16, seed=i), loss_fn=ce)
        rows.append(e.stats.history[-1]["rows"])
    e.close()
    return {"rows": rows, "history": e.meter.history}


def case_resume_save(cfg, rank, world, tmp):
    """2 steps on 7 rows with shares 0.7/0.3, then a checkpoint, for case_resume_one."""
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True,
                       shares=[0.7, 0.3], max_grad_norm=0.5)
    losses = [e.train_step(rows_batch(7, seed=i), loss_fn=ce) for i in range(2)]
    e.save(tmp / "resume")
    e.close()
    return {"losses": losses}


def case_resume_one(cfg, rank, world, tmp):
    """(A job of ONE rank.) case_resume_save's checkpoint of 2 ranks resumed on 1, step 3:
    the weights of 3 steps of plain PyTorch on the whole batches."""
    e = outcore.Engine.load(tmp / "resume", mlp(), device="cpu", distributed=True,
                            max_grad_norm=0.5)
    step = e.step_count
    loss = e.train_step(rows_batch(7, seed=2), loss_fn=ce)
    got = [p.detach().clone() for p in e.model.parameters()]
    e.close()
    ref = mlp()
    o = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS, weight_decay=WD)
    want = []
    for i in range(3):
        o.zero_grad()
        b = rows_batch(7, seed=i)
        lo = ce(ref(b["input"]), b)
        lo.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        o.step()
        want.append(lo.item())
    return {"world": world, "step": step, "loss": loss, "want": want[-1],
            "worst": max(rel(g, p.detach()) for g, p in zip(got, ref.parameters()))}


def case_raise_mid_step(cfg, rank, world, tmp):
    """Rank 1's loss_fn raises in step 2 and its program ends with the traceback; rank 0
    sits in that step's collectives. (worker: cfg["reraise"])"""
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True)

    def loss_fn(out, b):
        if rank == 1 and e.step_count == 1:
            raise RuntimeError("a bug in rank 1's loss")
        return ce(out, b)
    for i in range(3):
        e.train_step(rows_batch(seed=i), loss_fn=loss_fn)
    return {}


# -- the user's view ----------------------------------------------------------------------
def case_edits(cfg, rank, world, tmp):
    """Weights set to 0 through engine.model are what the next step and save start from."""
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True)
    b = rows_batch()
    e.train_step(b, loss_fn=ce)
    with torch.no_grad():
        for p in e.model.parameters():
            p.zero_()
    again = max(p.abs().max().item() for p in e.model.parameters())   # gathered again
    e.train_step(b, loss_fn=ce)   # from zeros, one AdamW step moves a weight by <= ~lr
    stepped = max(p.abs().max().item() for p in e.model.parameters())
    with torch.no_grad():
        for p in e.model.parameters():
            p.fill_(0.5)
    e.save(tmp / "edits")
    e.close()
    e2 = outcore.Engine.load(tmp / "edits", mlp(), device="cpu", distributed=True)
    loaded = [p.detach().clone() for p in e2.model.parameters()]
    e2.close()
    return {"again": again, "stepped": stepped,
            "loaded_all_half": all(bool((p == 0.5).all()) for p in loaded)}


class Gate(nn.Module):
    """h = x * w + b, its non-finite entries zeroed: a non-finite input stays out of the
    forward but makes w's gradient NaN (NaN * 0), and no other parameter's."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))
        self.b = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        h = x * self.w + self.b
        return torch.where(torch.isfinite(h), h, torch.zeros_like(h))


def case_nonfinite(cfg, rank, world, tmp):
    """Without clipping or skip_nonfinite, a non-finite gradient skips its group's update:
    in one process the whole group. Here w's gradient is NaN through rank 1's rows only,
    and the Gate group's flat slices are w (rank 0's) and b (rank 1's): rank 1's slice is
    finite, and it was updated while rank 0's was skipped."""
    def model():
        torch.manual_seed(1)
        return nn.Sequential(Gate(), nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))

    b = rows_batch()
    b["input"][3:, 0] = float("nan")      # rows 3..5: rank 1's of 6 (equal shares)
    e = outcore.Engine(model(), optimizer=opt(), device="cpu", distributed=True)
    loss = e.train_step(b, loss_fn=ce)
    got = {k: v.detach().clone() for k, v in e.model.named_parameters()}
    e.close()
    one = outcore.Engine(model(), optimizer=opt(), device="cpu")
    want_loss = one.train_step(b, loss_fn=ce)
    want = {k: v.detach().clone() for k, v in one.model.named_parameters()}
    one.close()
    init = dict(model().named_parameters())
    return {"loss": loss, "want_loss": want_loss,
            "gate_kept": all(bool((got[k] == init[k]).all()) for k in ("0.w", "0.b")),
            "worst": max(rel(got[k], want[k]) for k in want)}


def case_batch_differs(cfg, rank, world, tmp):
    """Rank 1 passes another batch (a per-rank batch, as with DDP): one-line error on
    every rank before the step; nothing trained."""
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True)
    before = [p.detach().clone() for p in e.model.parameters()]
    err = one_line_error(lambda: e.train_step(rows_batch(seed=rank), loss_fn=ce))
    same = all(bool((a == p).all()) for a, p in zip(before, e.model.parameters()))
    e.close()
    return {"err": err, "same": same}


def case_model_buffers(cfg, rank, world, tmp):
    """engine.model shows the running statistics the engine trains (its device copies on a
    GPU: copies here too, as a GPU's would be), not the model's initial ones."""
    e = outcore.Engine(mlp(norm=True), optimizer=opt(), device="cpu", distributed=True)
    e._buffers = [{k: v.clone() for k, v in d.items()} for d in e._buffers]
    for i in range(2):
        e.train_step(rows_batch(seed=i, shift=3.0), loss_fn=ce)
    trained = {k: v.clone() for d in e._buffers for k, v in d.items()}
    shown = {k.split(".", 1)[1]: v.clone() for k, v in e.model.named_buffers()}
    e.close()
    return {"diff": {k: (trained[k].double() - shown[k].double()).abs().max().item()
                     for k in trained},
            "moved": float(trained["running_mean"].abs().max())}


# -- checkpoints --------------------------------------------------------------------------
def case_buffers(cfg, rank, world, tmp):
    """BatchNorm's running statistics (each rank's, over its rows) survive save + load."""
    e = outcore.Engine(mlp(norm=True), optimizer=opt(), device="cpu", distributed=True)
    for i in range(2):
        e.train_step(rows_batch(seed=i, shift=3.0), loss_fn=ce)
    before = {k: v.clone() for k, v in e.model.named_buffers()}
    e.save(tmp / "bn")
    e.close()
    e2 = outcore.Engine.load(tmp / "bn", mlp(norm=True), device="cpu", distributed=True)
    after = dict(e2.model.named_buffers())
    e2.close()
    return {"diff": {k: (before[k].double() - after[k].double()).abs().max().item()
                     for k in before}}


def case_bad_loads(cfg, rank, world, tmp):
    """Loading into another shape, from a checkpoint missing a shard or with a damaged
    state.json: one-line OutcoreErrors on every rank."""
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True)
    e.train_step(rows_batch(), loss_fn=ce)
    e.save(tmp / "ck")
    e.close()
    out = {"wider": one_line_error(
        lambda: outcore.Engine.load(tmp / "ck", mlp(17), device="cpu", distributed=True))}
    torch.distributed.barrier()
    if rank == 0:
        import shutil
        shutil.copytree(tmp / "ck", tmp / "ck-noshard")
        (tmp / "ck-noshard" / f"shard-{world - 1}.safetensors").unlink()
        shutil.copytree(tmp / "ck", tmp / "ck-json")
        (tmp / "ck-json" / "state.json").write_text('{"format": "outcore-sh')
    torch.distributed.barrier()
    out["noshard"] = one_line_error(
        lambda: outcore.Engine.load(tmp / "ck-noshard", mlp(), device="cpu", distributed=True))
    out["json"] = one_line_error(
        lambda: outcore.Engine.load(tmp / "ck-json", mlp(), device="cpu", distributed=True))
    # the right model still loads, and trains
    e3 = outcore.Engine.load(tmp / "ck", mlp(), device="cpu", distributed=True)
    out["after"] = e3.train_step(rows_batch(), loss_fn=ce)
    e3.close()
    return out


def case_save_other_dir(cfg, rank, world, tmp):
    """save into a directory of other files must refuse, as one process does, on every
    rank, and leave the files; then training and a save elsewhere go on."""
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True)
    e.train_step(rows_batch(), loss_fn=ce)
    mine = tmp / "mine"
    if rank == 0:
        mine.mkdir()
        (mine / "notes.txt").write_text("keep me")
    torch.distributed.barrier()
    err = one_line_error(lambda: e.save(mine))
    e.train_step(rows_batch(), loss_fn=ce)
    e.save(tmp / "fine")
    e.close()
    return {"err": err, "kept": (mine / "notes.txt").is_file(),
            "fine": (tmp / "fine" / "state.json").is_file()}


def case_save_unwritable(cfg, rank, world, tmp):
    """A path rank 0 cannot create (under a file): every rank gets its error at once
    (the others used to wait in a collective for 60 s) and the job goes on."""
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True)
    e.train_step(rows_batch(), loss_fn=ce)
    if rank == 0:
        (tmp / "a-file").write_text("x")
    torch.distributed.barrier()
    t = time.monotonic()
    err = one_line_error(lambda: e.save(tmp / "a-file" / "ck"))
    seconds = time.monotonic() - t
    loss = e.train_step(rows_batch(), loss_fn=ce)
    e.save(tmp / "ok")
    e.close()
    return {"err": err, "seconds": seconds, "loss": loss,
            "ok": (tmp / "ok" / "state.json").is_file()}


def case_shard_fails(cfg, rank, world, tmp):
    """Rank 1 cannot write its shard (a full disk, as an OSError): every rank gets a
    one-line error within seconds (rank 0 used to wait for it in a barrier for 60 s, then
    fail), no checkpoint nor temporary directory is left, and the job goes on."""
    import errno

    from outcore.parallel import checkpoint as ck
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True)
    e.train_step(rows_batch(), loss_fn=ce)
    real = ck._write_shard

    def full_disk(engine, where):
        raise OSError(errno.ENOSPC, "No space left on device")
    if rank == 1:
        ck._write_shard = full_disk
    t = time.monotonic()
    try:
        err = one_line_error(lambda: e.save(tmp / "full" / "ck"))
    finally:
        ck._write_shard = real
    seconds = time.monotonic() - t
    torch.distributed.barrier()
    left = sorted(p.name for p in (tmp / "full").iterdir()) if (tmp / "full").is_dir() else []
    loss = e.train_step(rows_batch(), loss_fn=ce)
    e.save(tmp / "full" / "ck")
    e.close()
    return {"err": err, "seconds": seconds, "left": left, "loss": loss,
            "ok": (tmp / "full" / "ck" / "state.json").is_file()}


# -- mismatches across ranks --------------------------------------------------------------
def case_mismatch(cfg, rank, world, tmp):
    """Rank 1 builds a wider model, then rank 1 alone clips: a one-line error on every
    rank at construction (it used to abort in gloo, or hang, at the first step)."""
    out = {"model": one_line_error(lambda: outcore.Engine(
        mlp(17 if rank == 1 else 16), optimizer=opt(), device="cpu", distributed=True))}
    out["clip"] = one_line_error(lambda: outcore.Engine(
        mlp(), optimizer=opt(), device="cpu", distributed=True,
        max_grad_norm=1.0 if rank == 1 else None))
    e = outcore.Engine(mlp(), optimizer=opt(), device="cpu", distributed=True)  # still fine
    out["after"] = e.train_step(rows_batch(), loss_fn=ce)
    e.close()
    return out


def main(cfg: dict) -> None:
    init_distributed(backend="gloo", heartbeat_s=cfg.get("heartbeat", 20))
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    tmp = Path(cfg["tmp"])
    for name in cfg["cases"]:
        t = time.monotonic()
        try:
            res = globals()[f"case_{name}"](cfg, rank, world, tmp)
        except Exception as e:   # noqa: BLE001 - recorded for the test to show
            if cfg.get("reraise"):
                raise
            res = {"raised": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        res["seconds_case"] = time.monotonic() - t
        torch.save(res, f"{cfg['out']}.{name}.{rank}")
        if "raised" in res:
            break   # the ranks may no longer agree on the collectives to come
    shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
