"""Sharded checkpoints: every rank writes its own shard; any world size can load them.

Layout of PATH/ (written under a temporary name by rank 0, renamed when all ranks wrote):
  state.json               format "outcore-sharded-1", world, step, optimizer, per-group
                           names, shapes and numel
  shard-{r}.safetensors    rank r's slice of every group: master.{g}, exp_avg.{g},
                           exp_avg_sq.{g}, step.{g} (slices of the padded flat buffers)
  buffers-{r}.safetensors  rank r's persistent buffers (BatchNorm statistics: each rank's
                           are over its own rows)
  rng-{r}.pt               rank r's torch (and CUDA) RNG state
Loading re-slices per group (O(largest group) extra host memory), so a job may resume on
another number of ranks; a single-process checkpoint (engine.save of outcore.Engine)
loads too. The directory must be on a filesystem every rank sees (multi-node: shared).

Only rank 0's `path` counts (outcore train's other ranks pass their own). Every failure is
agreed over the ranks, so each raises the same kind of one-line error instead of waiting
in a collective for a rank that gave up: rank 0's refusal of the path (as one process
refuses it: a directory of other files, a file), a rank that cannot write its shard, rank 0
failing to move the directory into place.
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
from ..stream.checkpoint import _buffers, _check_target, atomic_dir, load_buffers, read_state
from ..stream.optimizer import AdamW
from ..stream.materialize import is_lazy, left_as_is

FORMAT = "outcore-sharded-1"


def _why(e: BaseException) -> str:
    text = getattr(e, "strerror", None) or str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def _write_shard(engine, tmp: Path) -> None:
    r = engine.rank
    t = {}
    for g in range(len(engine.groups)):
        t[f"master.{g}"] = engine.host.master[g]
        t[f"exp_avg.{g}"] = engine.opt.m[g]
        t[f"exp_avg_sq.{g}"] = engine.opt.v[g]
        t[f"step.{g}"] = engine.opt.steps[g].reshape(1)
    save_file(t, str(tmp / f"shard-{r}.safetensors"))
    # Host sync (device buffers): once a save, after synchronize().
    save_file({k: b.detach().to("cpu", copy=True).contiguous()
               for k, b in _buffers(engine).items()}, str(tmp / f"buffers-{r}.safetensors"))
    rng = {"cpu": torch.get_rng_state(),
           "cuda": torch.cuda.get_rng_state(engine.device) if engine.lanes.cuda else None}
    torch.save(rng, tmp / f"rng-{r}.pt")


def _agree(engine, error: str | None, what: str) -> None:
    """Collective: raise on every rank when any rank failed at `what` (error: this rank's
    one-line reason, None if it did not fail)."""
    flags = engine.comm.gather_rows([1.0 if error else 0.0]).tolist()
    failed = [r for r, (f,) in enumerate(flags) if f]
    if error:
        raise OutcoreError(error)
    if failed:
        raise OutcoreError(f"rank {failed[0]} could not {what} (its own message says why); "
                           "the checkpoint was not written: fix that and save again")


def save(engine, path) -> None:
    """Collective: rank 0 checks `path` and makes the temporary directory, all ranks write
    their shards into it, rank 0 renames it to `path`."""
    engine.synchronize()

    def share(box: list) -> list:   # rank 0's [tmp, error, target] to every rank
        dist.broadcast_object_list(box, src=0)
        return box

    if engine.rank != 0:
        tmp, error, target = share([None, None, None])
        if error:
            raise OutcoreError(error)
        mine = None
        try:
            _write_shard(engine, Path(tmp))
        except Exception as e:   # a full disk, a quota, a mount this host cannot write
            mine = (f"rank {engine.rank} could not write its shard into {tmp} ({_why(e)}): "
                    "give a path every rank can write (several machines: a shared "
                    "filesystem) on a disk with room")
        _agree(engine, mine, f"write its shard of {target}")
        _agree(engine, None, f"move the checkpoint into place at {target}")
        return

    try:
        target = _check_target(path)
    except (OutcoreError, TypeError) as e:
        share([None, str(e), None])
        raise
    shared = written = False

    def write(tmp: Path) -> None:   # inside atomic_dir
        nonlocal shared, written
        share([str(tmp), None, str(target)])
        shared = True
        mine = None
        try:
            state = {"format": FORMAT, "world": engine.world, "step": engine.step_count,
                     "optimizer": dataclasses.asdict(engine.optimizer_config),
                     "groups": [{"names": g.names, "numel": g.numel,
                                 "shapes": [list(shape) for shape in g.shapes]}
                                for g in engine.groups]}
            (tmp / "state.json").write_text(json.dumps(state))
            _write_shard(engine, tmp)
        except Exception as e:
            mine = (f"could not write the checkpoint {target} ({_why(e)}): free disk space or "
                    "give another path")
        _agree(engine, mine, f"write its shard of {target}")  # every shard is on disk
        written = True

    try:
        atomic_dir(target, write)
    except BaseException as e:
        if not shared:   # atomic_dir could not make the temporary directory
            share([None, str(e) if isinstance(e, OutcoreError) else
                   f"cannot write {target} ({_why(e)}): give a path in a writable directory",
                   None])
        elif written:    # the fsync or the rename failed: the others wait for the verdict
            _agree(engine, f"could not move the checkpoint into place at {target} "
                           f"({_why(e)}): check the directory, then save again", "")
        raise
    _agree(engine, None, f"move the checkpoint into place at {target}")


class _Source:
    """Full (unpadded) flat tensors per group, from a sharded or a single-process save."""

    def __init__(self, path: Path, state: dict):
        self.path, self.state = path, state
        self.sharded = state["format"] == FORMAT
        if self.sharded:
            names = [f"shard-{r}.safetensors" for r in range(state["world"])]
        else:
            names = ["master.safetensors", "optim.safetensors"]
        self.names = [path / n for n in names]
        self.files = [_read(f, lambda f: safe_open(str(f), "pt")) for f in self.names]

    def _get(self, i: int, key: str) -> torch.Tensor:
        return _read(self.names[i], lambda f: self.files[i].get_tensor(key))

    def full(self, g: int, which: str) -> torch.Tensor | None:
        n = self.state["groups"][g].get("numel")
        if self.sharded:
            parts = [self._get(i, f"{which}.{g}") for i in range(len(self.files))]
            return torch.cat(parts)[:n]
        i = 0 if which == "master" else 1
        key = f"group.{g}" if which == "master" else f"group.{g}.{which}"
        return self._get(i, key).reshape(-1) if key in self.files[i].keys() else None

    def step(self, g: int) -> torch.Tensor | None:
        if self.sharded:
            return self._get(0, f"step.{g}").reshape(())
        key = f"group.{g}.step"
        return self._get(1, key).reshape(()) if key in self.files[1].keys() else None


def _read(f: Path, read):
    """read(f), a missing or damaged file as a one-line error naming it."""
    try:
        return read(f)
    except Exception as e:
        raise OutcoreError(f"{f} is missing or damaged ({_why(e)}): copy the whole checkpoint "
                           "directory again, or load another checkpoint") from None


def _state(path: Path) -> dict:
    state = read_state(path)
    if state.get("format") not in (FORMAT, SINGLE_FORMAT):
        raise OutcoreError(f"{path}: unknown checkpoint format {state.get('format')!r}")
    groups, opt = state.get("groups"), state.get("optimizer")
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "names" in g
                                               for g in groups) or \
            not isinstance(state.get("step"), int) or not isinstance(opt, dict) or \
            not {"lr", "betas", "eps", "weight_decay"} <= set(opt) or \
            (state["format"] == FORMAT and not isinstance(state.get("world"), int)):
        raise OutcoreError(f"{path}/state.json is damaged (its groups, step, optimizer or "
                           "world are missing): load another checkpoint")
    return state


def _other_model(path: Path, state: dict, engine) -> str | None:
    """Why the checkpoint's parameters are not the engine's (names, blocks, shapes), or None."""
    if [g["names"] for g in state["groups"]] != [g.names for g in engine.groups]:
        return "other parameters or blocks"
    for saved, grp in zip(state["groups"], engine.groups):
        shapes = saved.get("shapes")
        if shapes is not None:
            for name, s, here in zip(grp.names, shapes, grp.shapes):
                if list(s) != list(here):
                    return f"{name} {list(s)} saved, {list(here)} here"
        elif saved.get("numel") not in (None, grp.numel):
            return f"{saved['numel']} elements saved in {grp.name or 'rest'}, {grp.numel} here"
    return None


def load(path, model, **kwargs):
    """Build a sharded engine from `path` (sharded or single-process checkpoint)."""
    from ..stream.engine import Engine
    path = Path(path)
    state = _state(path)
    if "optimizer" not in kwargs:
        c = state["optimizer"]
        kwargs["optimizer"] = AdamW(lr=c["lr"], betas=tuple(c["betas"]), eps=c["eps"],
                                    weight_decay=c["weight_decay"])
    kwargs["distributed"] = True
    if is_lazy(model):
        kwargs.setdefault("init", left_as_is)   # no initial values: the checkpoint's replace them
    engine = Engine(model, **kwargs)
    try:
        why = _other_model(path, state, engine)
        if why is not None:
            raise OutcoreError(f"{path} was saved from another model ({why}): load it into the "
                               "same architecture")
        _fill(engine, path, state)
    except BaseException:
        engine.close()   # its optimizer thread; the error is the same on every rank
        raise
    return engine


def _fill(engine, path: Path, state: dict) -> None:
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
    # buffers: this rank's own, else rank 0's (a job resumed on more ranks), else a
    # single-process checkpoint's
    for name in (f"buffers-{engine.rank}.safetensors", "buffers-0.safetensors",
                 "buffers.safetensors"):
        if (path / name).is_file():
            load_buffers(engine, path / name)
            break
    engine.step_count = state["step"]
    rng_file = path / f"rng-{engine.rank}.pt"
    if not rng_file.is_file():
        rng_file = path / "rng.pt"
    if rng_file.is_file():
        rng = _read(rng_file, lambda f: torch.load(f, weights_only=False))
        torch.set_rng_state(rng["cpu"])
