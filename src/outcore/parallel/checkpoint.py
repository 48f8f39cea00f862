"""Sharded checkpoints: every rank writes its own shard; any world size can load them.

Layout of PATH/ (written under a temporary name by rank 0, renamed when all ranks wrote):
  state.json               format "outcore-sharded-1", world, step, optimizer, per-group
                           names and numel
  shard-{r}.safetensors    rank r's slice of every group: master.{g}, exp_avg.{g},
                           exp_avg_sq.{g}, step.{g} (slices of the padded flat buffers)
  rng-{r}.pt               rank r's torch (and CUDA) RNG state
Loading re-slices per group (O(largest group) extra host memory), so a job may resume on
another number of ranks; a single-process checkpoint (engine.save of outcore.Engine)
loads too. The directory must be on a filesystem every rank sees (multi-node: shared).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import OutcoreError
from ..stream.checkpoint import FORMAT as SINGLE_FORMAT
from ..stream.checkpoint import atomic_dir
from ..stream.optimizer import AdamW
from ..stream.materialize import is_lazy, left_as_is

FORMAT = "outcore-sharded-1"


def _write_shard(engine, tmp: Path) -> None:
    r = engine.rank
    t = {}
    for g in range(len(engine.groups)):
        t[f"master.{g}"] = engine.host.master[g]
        t[f"exp_avg.{g}"] = engine.opt.m[g]
        t[f"exp_avg_sq.{g}"] = engine.opt.v[g]
        t[f"step.{g}"] = engine.opt.steps[g].reshape(1)
    save_file(t, str(tmp / f"shard-{r}.safetensors"))
    rng = {"cpu": torch.get_rng_state(),
           "cuda": torch.cuda.get_rng_state(engine.device) if engine.lanes.cuda else None}
    torch.save(rng, tmp / f"rng-{r}.pt")


def save(engine, path) -> None:
    """Collective: rank 0 makes the temporary directory, all ranks write, rank 0 renames."""
    engine.synchronize()
    path = Path(path)

    def share_tmp(tmp: Path | None) -> Path:
        box = [str(tmp) if tmp else None]
        dist.broadcast_object_list(box, src=0)
        return Path(box[0])

    def write(tmp: Path) -> None:  # rank 0 only, inside atomic_dir
        share_tmp(tmp)
        state = {"format": FORMAT, "world": engine.world, "step": engine.step_count,
                 "optimizer": dataclasses.asdict(engine.optimizer_config),
                 "groups": [{"names": g.names, "numel": g.numel} for g in engine.groups]}
        (tmp / "state.json").write_text(json.dumps(state))
        _write_shard(engine, tmp)
        engine.comm.barrier()  # every rank's shard is on disk before the rename

    if engine.rank == 0:
        atomic_dir(path, write)
    else:
        tmp = share_tmp(None)
        _write_shard(engine, tmp)
        engine.comm.barrier()
    engine.comm.barrier()  # the rename is done: nobody reads a half-moved checkpoint


class _Source:
    """Full (unpadded) flat tensors per group, from a sharded or a single-process save."""

    def __init__(self, path: Path, state: dict):
        self.path, self.state = path, state
        self.sharded = state["format"] == FORMAT
        if self.sharded:
            self.files = [safe_open(str(path / f"shard-{r}.safetensors"), "pt")
                          for r in range(state["world"])]
        else:
            self.files = [safe_open(str(path / "master.safetensors"), "pt"),
                          safe_open(str(path / "optim.safetensors"), "pt")]

    def full(self, g: int, which: str) -> torch.Tensor | None:
        n = self.state["groups"][g].get("numel")
        if self.sharded:
            parts = [f.get_tensor(f"{which}.{g}") for f in self.files]
            return torch.cat(parts)[:n]
        f = self.files[0] if which == "master" else self.files[1]
        key = f"group.{g}" if which == "master" else f"group.{g}.{which}"
        return f.get_tensor(key).reshape(-1) if key in f.keys() else None

    def step(self, g: int) -> torch.Tensor | None:
        if self.sharded:
            return self.files[0].get_tensor(f"step.{g}").reshape(())
        key = f"group.{g}.step"
        return self.files[1].get_tensor(key).reshape(()) if key in self.files[1].keys() else None


def load(path, model, **kwargs):
    """Build a sharded engine from `path` (sharded or single-process checkpoint)."""
    from ..stream.engine import Engine
    path = Path(path)
    if not (path / "state.json").is_file():
        raise OutcoreError(f"{path} is not an outcore checkpoint (no state.json): pass the "
                           "directory written by engine.save")
    state = json.loads((path / "state.json").read_text())
    if state.get("format") not in (FORMAT, SINGLE_FORMAT):
        raise OutcoreError(f"{path}: unknown checkpoint format {state.get('format')!r}")
    if "optimizer" not in kwargs:
        c = state["optimizer"]
        kwargs["optimizer"] = AdamW(lr=c["lr"], betas=tuple(c["betas"]), eps=c["eps"],
                                    weight_decay=c["weight_decay"])
    kwargs["distributed"] = True
    if is_lazy(model):
        kwargs.setdefault("init", left_as_is)   # no initial values: the checkpoint's replace them
    engine = Engine(model, **kwargs)
    if [g["names"] for g in state["groups"]] != [g.names for g in engine.groups]:
        raise OutcoreError(f"{path} was saved from a model with other parameters or blocks: "
                           "load it into the same architecture")
    for g, grp in enumerate(state["groups"]):
        grp.setdefault("numel", engine.groups[g].numel)
    src = _Source(path, state)
    for g in range(len(engine.groups)):
        lo, hi = engine.host.bounds(g)
        for which, dst in (("master", engine.host.master[g]), ("exp_avg", engine.opt.m[g]),
                           ("exp_avg_sq", engine.opt.v[g])):
            full = src.full(g, which)
            if full is None or not dst.numel():
                continue
            padded = torch.zeros(engine.host.padded[g])
            padded[:full.numel()] = full
            dst.copy_(padded[lo:hi])
        st = src.step(g)
        if st is not None:
            engine.opt.steps[g].copy_(st)
    engine.step_count = state["step"]
    rng_file = path / f"rng-{engine.rank}.pt"
    if not rng_file.is_file():
        rng_file = path / "rng.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["cpu"])
    return engine
