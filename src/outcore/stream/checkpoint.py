"""engine.save / Engine.load: a directory written under a temporary name, then renamed.

Layout of PATH/:
  state.json          format, step, optimizer config, per-group names/shapes/offsets
  master.safetensors  group.{g}: flat fp32 master weights of group g
  optim.safetensors   group.{g}.exp_avg / .exp_avg_sq / .step: AdamW state of group g
  buffers.safetensors the model's persistent buffers by name (BatchNorm statistics)
  rng.pt              torch (and CUDA) RNG states
"""

from __future__ import annotations

import dataclasses
import glob
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    except OSError as e:   # not writable, a file on the way, no such device
        raise OutcoreError(f"cannot write {path} ({e.strerror or e}): give a path in a "
                           "writable directory") from None
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
        _fsync_dir(path.parent)   # the renames themselves survive a power loss
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_dir(d: Path) -> None:
    """Flush a directory's entries (POSIX; elsewhere a directory cannot be opened so)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:   # some filesystems refuse fsync on a directory: nothing to flush then
        pass
    finally:
        os.close(fd)


def _check_target(path) -> Path:
    """Where engine.save may write: a new path, an empty directory or an older checkpoint
    (replaced whole, so never a directory of other files, nor a file)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"engine.save takes a directory path, not {type(path).__name__}")
    path = Path(path)
    if path.is_dir() and any(path.iterdir()) and not (path / "state.json").is_file():
        raise OutcoreError(f"{path} is a directory that is not an outcore checkpoint: save "
                           "replaces the whole directory, so give a new or empty path")
    if path.exists() and not path.is_dir():
        raise OutcoreError(f"{path} is a file: engine.save writes a directory, give "
                           "another path")
    return Path(os.path.abspath(path))   # "." and "x/.." get a name to rename


def _buffers(engine) -> dict[str, torch.Tensor]:
    """The model's persistent buffers (BatchNorm's running statistics, counters) by name,
    as the engine uses them: its per-group device copies (flow._device_buffers)."""
    keep = set(engine._model.state_dict(keep_vars=True))
    out = {}
    for g, bufs in enumerate(engine._buffers):
        prefix = f"{engine.groups[g].name}." if g else ""
        for local, b in bufs.items():
            if prefix + local in keep and b is not None:
                out[prefix + local] = b
    return out


def save(engine, path) -> None:
    path = _check_target(path)
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
        # Host sync (device buffers): once a save, after synchronize() above.
        save_file({k: b.detach().to("cpu", copy=True).contiguous()
                   for k, b in _buffers(engine).items()}, str(tmp / "buffers.safetensors"))
        rng = {"cpu": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        torch.save(rng, tmp / "rng.pt")
    atomic_dir(Path(path), write)


def read_state(path: Path) -> dict:
    """A checkpoint's state.json as a dict (this engine's or parallel/checkpoint.py's), or
    a one-line error: not a checkpoint, or damaged."""
    if not path.exists():
        left = (sorted(path.parent.glob(f".{glob.escape(path.name)}.old-*"))
                if path.parent.is_dir() else [])
        if left:   # atomic_dir's crash window: after the first rename, before the second
            raise OutcoreError(f"{path} is missing: a save over it was interrupted, and the "
                               f"checkpoint before that save is {left[-1]}: rename that "
                               f"directory to {path.name} and load again")
    if not (path / "state.json").is_file():
        raise OutcoreError(f"{path} is not an outcore checkpoint (no state.json): pass the "
                           "directory written by engine.save")
    try:
        state = json.loads((path / "state.json").read_text())
    except ValueError as e:   # JSONDecodeError, UnicodeDecodeError
        raise OutcoreError(f"{path}/state.json is damaged ({str(e).splitlines()[0]}): load "
                           "another checkpoint") from None
    if not isinstance(state, dict):
        raise OutcoreError(f"{path}/state.json is damaged (not a JSON object): load another "
                           "checkpoint")
    return state


def load_buffers(engine, file: Path) -> None:
    """The model's persistent buffers from a buffers*.safetensors file: into the engine's
    (device) copies and the model's own host buffers."""
    saved = _read(file, lambda f: load_file(str(f)))
    live = dict(engine._model.named_buffers())
    for name, b in _buffers(engine).items():
        if name in saved:
            b.copy_(saved[name])
            if live[name] is not b:
                live[name].copy_(saved[name])   # the model's own (host) buffer too


def load(cls, path, model, **kwargs):
    path = Path(path)
    state = read_state(path)
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
    # kept[i]: the saved group of group i here (entries without parameters were empty
    # groups in checkpoints from before blocks.build_groups left them to `rest`)
    kept = [i for i, g in enumerate(state["groups"]) if i == 0 or g["names"]]
    groups = [state["groups"][i] for i in kept]
    saved = [(n, s) for g in groups for n, s in zip(g["names"], g["shapes"])]
    here = [(n, list(p.shape)) for g in engine.groups for n, p in zip(g.names, g.params)]
    blocks = [len(g["names"]) for g in groups] != [len(g.names) for g in engine.groups]
    if saved != here or blocks:
        engine.close()   # its optimizer thread
        diff = next((f"{a[0]} {a[1]} saved, {b[0]} {b[1]} here" for a, b in zip(saved, here)
                     if a != b), None)
        if diff is None and len(saved) != len(here):   # one list is the other's start
            n = min(len(saved), len(here))
            first = (f"{saved[n][0]} {saved[n][1]} saved, not here" if len(saved) > n else
                     f"{here[n][0]} {here[n][1]} here, not saved")
            diff = f"{first}; {len(saved)} parameters saved, {len(here)} here"
        diff = diff or "other blocks"
        raise OutcoreError(f"{path} was saved from another model ({diff}): load it into the "
                           "same architecture")
    master = _read(path / "master.safetensors", lambda f: load_file(str(f)))
    for i, m in enumerate(engine.host.master):
        if m.numel():
            m.copy_(master[f"group.{kept[i]}"])
            engine.host.refresh(i)   # the 16-bit copy was made from the model's weights
    opt = _read(path / "optim.safetensors", lambda f: load_file(str(f)))
    for i in range(len(engine.groups)):
        st = {k.split(".", 2)[2]: v for k, v in opt.items()
              if k.startswith(f"group.{kept[i]}.")}
        if "step" in st:
            st["step"] = st["step"].reshape(())
        engine.opt.load_state_tensors(i, st)
    if (path / "buffers.safetensors").is_file():   # absent in checkpoints before buffers
        load_buffers(engine, path / "buffers.safetensors")
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
