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
from pathlib import Path

from .stream.checkpoint import atomic_dir

STEP_RE = re.compile(r"^step-(\d+)$")
# Fault injection for the crash tests: SIGKILL this process in the middle of writing the
# checkpoint of this step (after the engine state, before trainer.json and the rename).
KILL_ENV = "OUTCORE_TEST_KILL_DURING_SAVE"


def save_run(path: Path, engine, tokenizer, trainer_state: dict, hf: bool) -> None:
    """Engine state + (HF models) a Hugging Face checkpoint with its tokenizer, atomically."""
    def write(tmp: Path) -> None:
        engine.save(tmp / "outcore")
        if hf:
            from .hf import save_hf
            save_hf(engine.model, tokenizer, tmp)
        if os.environ.get(KILL_ENV) == str(trainer_state["step"]):
            os.kill(os.getpid(), signal.SIGKILL)
        (tmp / "trainer.json").write_text(json.dumps(trainer_state, indent=1))
    atomic_dir(path, write)


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
        found.append((json.loads((final / "trainer.json").read_text())["step"], final))
    return sorted(found, key=lambda t: (t[0], t[1].name == "final"))


def newest(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def clean_partial(out_dir: Path) -> int:
    """Remove temporaries left by a crash in the middle of a save; returns how many."""
    n = 0
    for parent in (out_dir, out_dir / "checkpoints"):
        if parent.is_dir():
            for d in parent.iterdir():
                if d.name.startswith(".") and (".tmp-" in d.name or ".old-" in d.name):
                    shutil.rmtree(d, ignore_errors=True)
                    n += 1
    return n


def step_dir(out_dir: Path, step: int) -> Path:
    return out_dir / "checkpoints" / f"step-{step:08d}"


def prune(out_dir: Path, keep_last: int) -> None:
    """Delete all but the newest keep_last periodic checkpoints (0 = keep all)."""
    if keep_last <= 0:
        return
    periodic = [d for _, d in list_checkpoints(out_dir) if d.name != "final"]
    for d in periodic[:-keep_last]:
        shutil.rmtree(d, ignore_errors=True)
