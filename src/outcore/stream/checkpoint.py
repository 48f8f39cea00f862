"""engine.save / Engine.load: a directory written under a temporary name, then renamed.

Layout of PATH/:
  state.json          format, step, optimizer config, per-group names/shapes/offsets
  master.safetensors  group.{g}: flat fp32 master weights of group g
  optim.safetensors   group.{g}.exp_avg / .exp_avg_sq / .step: AdamW state of group g
  rng.pt              torch (and CUDA) RNG states
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import OutcoreError
from .optimizer import AdamW
from .materialize import is_lazy, left_as_is

FORMAT = "outcore-engine-1"


def atomic_dir(path: Path, write) -> None:
    """Call write(tmpdir), then move tmpdir to `path`; a crash leaves the old `path` intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        write(tmp)
        for f in tmp.rglob("*"):  # flush file contents before the rename makes them visible
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save(engine, path) -> None:
    engine.synchronize()

    def write(tmp: Path) -> None:
        layout = [{"names": g.names, "shapes": [list(p.shape) for p in g.params],
                   "offsets": g.offsets} for g in engine.groups]
        state = {"format": FORMAT, "step": engine.step_count,
                 "optimizer": dataclasses.asdict(engine.optimizer_config), "groups": layout}
        (tmp / "state.json").write_text(json.dumps(state))
        save_file({f"group.{i}": m for i, m in enumerate(engine.host.master) if m.numel()},
                  str(tmp / "master.safetensors"))
        opt = {}
        for i in range(len(engine.groups)):
            for k, v in engine.opt.state_tensors(i).items():
                opt[f"group.{i}.{k}"] = v.reshape(-1) if v.dim() else v.reshape(1)
        save_file(opt, str(tmp / "optim.safetensors"))
        rng = {"cpu": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        torch.save(rng, tmp / "rng.pt")
    atomic_dir(Path(path), write)


def load(cls, path, model, **kwargs):
    path = Path(path)
    if not (path / "state.json").is_file():
        raise OutcoreError(f"{path} is not an outcore checkpoint (no state.json): pass the "
                           "directory written by engine.save")
    try:
        state = json.loads((path / "state.json").read_text())
    except ValueError as e:   # JSONDecodeError, UnicodeDecodeError
        raise OutcoreError(f"{path}/state.json is damaged ({e}): load another "
                           "checkpoint") from None
    if not isinstance(state, dict):
        raise OutcoreError(f"{path}/state.json is damaged (not a JSON object): load another "
                           "checkpoint")
    if state.get("format") == "outcore-sharded-1":   # parallel/checkpoint.py's FORMAT
        raise OutcoreError(f"{path} was saved by {state.get('world')} ranks: load it under "
                           "torchrun (outcore train --nproc N) or with distributed=True")
    if state.get("format") != FORMAT:
        raise OutcoreError(f"{path}: unknown checkpoint format {state.get('format')!r}")
    if "optimizer" not in kwargs:
        cfg = state["optimizer"]
        kwargs["optimizer"] = AdamW(lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["eps"],
                                    weight_decay=cfg["weight_decay"])
    if is_lazy(model):
        kwargs.setdefault("init", left_as_is)   # no initial values: the checkpoint's replace them
    engine = cls(model, **kwargs)
    saved = [g["names"] for g in state["groups"]]
    if saved != [g.names for g in engine.groups]:
        raise OutcoreError(f"{path} was saved from a model with other parameters or blocks: "
                           "load it into the same architecture")
    master = _read(path / "master.safetensors", lambda f: load_file(str(f)))
    for i, m in enumerate(engine.host.master):
        if m.numel():
            m.copy_(master[f"group.{i}"])
            engine.host.refresh(i)   # the 16-bit copy was made from the model's weights
    opt = _read(path / "optim.safetensors", lambda f: load_file(str(f)))
    for i in range(len(engine.groups)):
        st = {k.split(".", 2)[2]: v for k, v in opt.items() if k.startswith(f"group.{i}.")}
        if "step" in st:
            st["step"] = st["step"].reshape(())
        engine.opt.load_state_tensors(i, st)
    engine.step_count = state["step"]
    rng = _read(path / "rng.pt", lambda f: torch.load(f, weights_only=False))
    torch.set_rng_state(rng["cpu"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return engine


def _read(f: Path, read):
    """read(f), with a missing or damaged file (truncated: SafetensorError, EOFError,
    RuntimeError) as a one-line error naming it."""
    try:
        return read(f)
    except Exception as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OutcoreError(f"{f} is missing or damaged ({why}): load another "
                           "checkpoint") from None
