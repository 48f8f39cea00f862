"""Checkpoints of an `outcore train` run: periodic, on signals, atomic, the last K kept.

OUTPUT_DIR/
  checkpoints/step-00000010/   one per save (the newest K kept)
    config.json, model.safetensors, tokenizer files   a Hugging Face checkpoint (HF models)
    outcore/                   engine state: fp32 masters, AdamW m/v, step, RNG
    trainer.json               step, data fingerprint; written last
  final/                       the same layout, written at the end of the run

A checkpoint is written under a temporary name in the same folder, every file fsynced,
then renamed: a crash at any moment leaves either the old set or the new one, never a
half-written directory under a real name. The data position is the step count (batches
are a pure function of seed and step), so trainer.json's step is all a resume needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError

from .errors import OutcoreError
from .stream.checkpoint import FORMAT as SINGLE_FORMAT
from .stream.checkpoint import atomic_dir
from .units import fmt_bytes

SHARDED_FORMAT = "outcore-sharded-1"   # parallel/checkpoint.py's FORMAT

STEP_RE = re.compile(r"^step-(\d+)$")
# Fault injection for the crash tests: SIGKILL this process in the middle of writing the
# checkpoint of this step (after the engine state, before trainer.json and the rename).
KILL_ENV = "OUTCORE_TEST_KILL_DURING_SAVE"


def save_run(path: Path, engine, tokenizer, trainer_state: dict, hf: bool) -> None:
    """Engine state + (HF models) a Hugging Face checkpoint with its tokenizer, atomically.
    Collective with a sharded engine: rank 0 writes the directory, the other ranks their
    shards into rank 0's temporary directory (parallel/checkpoint.py)."""
    if getattr(engine, "rank", 0):
        engine.save(path / "outcore")   # the path is rank 0's: it broadcasts its own
        if hf:
            engine.model   # collective: rank 0 gathers the full weights for its HF copy
        return

    def write(tmp: Path) -> None:
        engine.save(tmp / "outcore")
        if hf:
            from .hf import save_hf
            save_hf(engine.model, tokenizer, tmp)
        if os.environ.get(KILL_ENV) == str(trainer_state["step"]):
            os.kill(os.getpid(), signal.SIGKILL)
        (tmp / "trainer.json").write_text(json.dumps(trainer_state, indent=1))
    try:
        atomic_dir(path, write)
    except (OSError, SafetensorError) as e:   # a full disk, a quota, a dead network mount
        # atomic_dir has removed the partial copy: earlier checkpoints are intact
        why = getattr(e, "strerror", None) or str(e).splitlines()[0]
        need = fmt_bytes(12 * engine.num_params * (2 if hf else 1))
        raise OutcoreError(f"could not write the checkpoint {path} ({why}): it needs about "
                           f"{need} of free disk; free space or pass --output-dir on a "
                           "larger disk (earlier checkpoints are kept)") from None


def is_complete(path: Path) -> bool:
    return (path / "trainer.json").is_file() and (path / "outcore" / "state.json").is_file()


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """[(step, dir)] of the complete checkpoints under out_dir, oldest first."""
    found = []
    ck = out_dir / "checkpoints"
    if ck.is_dir():
        for d in ck.iterdir():
            m = STEP_RE.match(d.name)
            if m and is_complete(d):
                found.append((int(m.group(1)), d))
    final = out_dir / "final"
    if is_complete(final):
        found.append((_step_of(final), final))
    return sorted(found, key=lambda t: (t[0], t[1].name == "final"))


def _step_of(ck: Path) -> int:
    """ck's step from trainer.json, else from the engine's state.json; a checkpoint whose
    step cannot be read sorts newest, where --resume finds it and says what is wrong."""
    for f in (ck / "trainer.json", ck / "outcore" / "state.json"):
        try:
            step = json.loads(f.read_text())["step"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(step, int):
            return step
    return sys.maxsize


def problem(ck: Path) -> str | None:
    """What stops checkpoint ck from loading, in a few words (None: nothing found). Reads
    its JSON files, RNG state and safetensors headers (a truncated file fails there), not
    the tensors."""
    from safetensors import safe_open
    try:
        step = json.loads((ck / "trainer.json").read_text())["step"]
        if not isinstance(step, int):
            return f"trainer.json's step is {step!r}"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"trainer.json is unreadable ({_first_line(e)})"
    eng = ck / "outcore"
    try:
        state = json.loads((eng / "state.json").read_text())
        fmt, world = state["format"], int(state.get("world", 1))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"outcore/state.json is unreadable ({_first_line(e)})"
    if fmt == SINGLE_FORMAT:
        files, rng = ["master.safetensors", "optim.safetensors"], ["rng.pt"]
    elif fmt == SHARDED_FORMAT:
        # rng-{r}.pt is optional: a job may resume on another number of ranks
        files, rng = [f"shard-{r}.safetensors" for r in range(world)], []
    else:
        return f"unknown checkpoint format {fmt!r}"
    for name in files:
        try:
            with safe_open(str(eng / name), "pt"):
                pass
        except Exception as e:   # SafetensorError (truncated), OSError (missing)
            return f"outcore/{name} is missing or damaged ({_first_line(e)})"
    for name in rng:   # a few KiB: read whole
        try:
            torch.load(eng / name, weights_only=False)
        except Exception as e:   # FileNotFoundError, EOFError / RuntimeError (truncated)
            return f"outcore/{name} is missing or damaged ({_first_line(e)})"
    return None


def pick_resume(out_dir: Path, say: Callable[[str], None], distributed: bool) -> Path | None:
    """--resume: the newest checkpoint under out_dir that loads (a damaged one is skipped,
    said in one line each), or None when there is none; before anything large is built.
    distributed: under torchrun (a sharded checkpoint needs it)."""
    removed = clean_partial(out_dir)
    if removed:
        say(f"--resume: removed {removed} partial checkpoint(s) left by a crash")
    found = [ck for _, ck in reversed(list_checkpoints(out_dir))]
    if not found:
        say(f"--resume: no complete checkpoint in {out_dir}, starting from step 0")
        return None
    for ck in found:
        why = problem(ck)
        if why is None:
            break
        say(f"--resume: skipping {ck}: {why}")
    else:
        raise OutcoreError(f"--resume: no checkpoint in {out_dir} loads (the newest, "
                           f"{found[0]}: {problem(found[0])}): restore it, or start "
                           "over in a new --output-dir")
    if checkpoint_format(ck) == SHARDED_FORMAT and not distributed:
        world = json.loads((ck / "outcore" / "state.json").read_text()).get("world")
        raise OutcoreError(f"--resume: {ck} was written by {world} ranks: pass --nproc N "
                           f"(e.g. --nproc {world}) to resume it")
    return ck


def check_resume(ck: Path, cfg) -> None:
    """--resume from ck with cfg (a TrainConfig): before anything large is built, refuse
    what would not continue the run. The data position is the step count, so the batches
    must be cut the same way (batch x grad_accum, seq_len) and drawn from the same seed;
    a reference size must be the one trained. (The data's fingerprint is checked once the
    data is read; other settings, e.g. --lr or --max-steps, may change on a resume.)"""
    st = json.loads((ck / "trainer.json").read_text())
    global_batch = cfg.batch_size * cfg.grad_accum
    if (st.get("global_batch"), st.get("seq_len")) != (global_batch, cfg.seq_len):
        raise OutcoreError(f"--resume: {ck} used batch {st.get('global_batch')} x seq "
                           f"{st.get('seq_len')}; the data position needs the same "
                           "--batch-size x --grad-accum and --seq-len")
    if "seed" in st and st["seed"] != cfg.seed:
        raise OutcoreError(f"--resume: {ck} was trained with --seed {st['seed']}, which orders "
                           f"its batches; --seed {cfg.seed} would repeat and skip data: pass "
                           f"--seed {st['seed']} or a new --output-dir")
    from .models import SIZES
    was = st.get("model")
    if isinstance(was, str) and was != cfg.model and (was in SIZES or cfg.model in SIZES):
        raise OutcoreError(f"--resume: {ck} was trained with --model {was}, not {cfg.model}: "
                           f"pass --model {was}, or a new --output-dir for another model")


def optimizer_changes(ck: Path, cfg) -> list[str]:
    """The AdamW settings of cfg that differ from checkpoint ck's run, as "name new (the
    checkpoint's: old)"; on --resume cfg's apply, as flags win everywhere."""
    try:
        was = json.loads((ck / "outcore" / "state.json").read_text())["optimizer"]
    except (OSError, ValueError, KeyError, TypeError):
        return []   # nothing to compare with: the load says what is wrong
    out = []
    for name in ("lr", "weight_decay", "betas", "eps"):
        new, old = getattr(cfg, name), was.get(name)
        if name == "betas":
            new, old = list(new), list(old) if old is not None else None
        if old is not None and new != old:
            out.append(f"{name} {new} (the checkpoint's: {old})")
    return out


def checkpoint_format(ck: Path) -> str | None:
    """The engine state's format of a checkpoint that passed problem()."""
    return json.loads((ck / "outcore" / "state.json").read_text()).get("format")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_output_dir(out_dir: Path, resume: bool) -> None:
    """Before anything large is built: out_dir is a directory this process can write (made
    if missing), and a fresh run does not write over an earlier run's checkpoints."""
    if not resume and has_checkpoints(out_dir):
        raise OutcoreError(f"--output-dir {out_dir} holds checkpoints of an earlier run: pass "
                           "--resume to continue it, or a new --output-dir")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".outcore-probe-", dir=out_dir)
        os.close(fd)
        os.unlink(probe)
    except FileExistsError:
        raise OutcoreError(f"--output-dir {out_dir} is a file: pass a directory") from None
    except NotADirectoryError:
        raise OutcoreError(f"--output-dir {out_dir}: part of that path is a file, not a "
                           "directory: pass a directory path") from None
    except OSError as e:
        raise OutcoreError(f"--output-dir {out_dir} is not writable ({e.strerror or e}): "
                           "pass a directory you can write to") from None


def has_checkpoints(out_dir: Path) -> bool:
    """Whether out_dir holds a final/ or a checkpoints/step-N/ directory (complete or not)."""
    if (out_dir / "final").is_dir():
        return True
    ck = out_dir / "checkpoints"
    return ck.is_dir() and any(STEP_RE.match(d.name) for d in ck.iterdir())


def newest(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


OLD_RE = re.compile(r"^\.(.+)\.old-\d+$")   # stream/checkpoint.py atomic_dir's old copy


def clean_partial(out_dir: Path) -> int:
    """Remove temporaries left by a crash in the middle of a save; returns how many.

    A save over an existing checkpoint (final/ of a resumed run) moves it to .NAME.old-PID,
    then the new one in: a crash between the two renames leaves the old copy the only one,
    so it is moved back to NAME (not removed) when NAME is missing."""
    n = 0
    for parent in (out_dir, out_dir / "checkpoints"):
        if parent.is_dir():
            for d in sorted(parent.iterdir()):
                m = OLD_RE.match(d.name)
                if m and not (parent / m.group(1)).exists() and is_complete(d):
                    os.replace(d, parent / m.group(1))
                    continue
                if d.name.startswith(".") and (".tmp-" in d.name or ".old-" in d.name):
                    shutil.rmtree(d, ignore_errors=True)
                    n += 1
    return n


def step_dir(out_dir: Path, step: int) -> Path:
    return out_dir / "checkpoints" / f"step-{step:08d}"


def prune(out_dir: Path, keep_last: int) -> None:
    """Delete the periodic checkpoints older than the newest keep_last that load (0 = keep
    all). Damaged ones do not count: after --resume skipped a damaged newest checkpoint,
    keeping it (by its step) deleted the good ones, the one just written included; damaged
    ones newer than those kept are left for the run to write over."""
    if keep_last <= 0:
        return
    periodic = [d for _, d in list_checkpoints(out_dir) if d.name != "final"]
    good = [d for d in periodic if problem(d) is None]
    if not good:
        return
    kept = good[-keep_last:]
    for d in periodic[:periodic.index(kept[0])]:
        shutil.rmtree(d, ignore_errors=True)
