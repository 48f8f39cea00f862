"""Typed configuration of `outcore train`, from flags and/or a TOML file.

Precedence: defaults < --config FILE.toml < explicit flags. An unknown key in the file is
an error naming the closest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from .errors import OutcoreError


@dataclass
class TrainConfig:
    model: str = "small"              # a reference size (outcore.models.SIZES) or an HF dir
    data: str | None = None           # text file, folder or JSONL; None = the stdlib corpus
    seq_len: int = 256
    batch_size: int = 16
    micro_batch_size: int | None = None
    grad_accum: int = 1               # micro steps summed into one update (batch x grad_accum)
    lr: float = 2e-3
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    # True: a non-finite loss or gradient skips the whole step; updates wait for the whole
    # gradient (no device-side AdamW). False (with max_grad_norm 0): each group's update
    # starts when its gradient is ready and a non-finite group is left as it was.
    skip_nonfinite: bool = True
    warmup_steps: int = 10
    max_steps: int = 60
    save_every: int = 0               # 0: only at the end
    keep_last: int = 3                # periodic checkpoints kept (0 = all)
    max_bad_steps: int = 5            # non-finite steps in a row before the run stops
    tensorboard: bool = True
    output_dir: str = "outcore-demo"
    resume: bool = False
    device: str = "auto"              # auto = cuda when present, else cpu
    gpu_memory: str | None = None
    compute_dtype: str = "auto"       # auto | float32 | bfloat16 | tf32
    compile_kernels: bool = False     # reference sizes: DecoderConfig(compiled=True)
    host_weight_copy: str = "auto"    # auto | fused | cast | device | off: Engine(host_weight_copy)
    keep_weights: bool = True         # Engine(keep_weights=...): device-updated blocks' weights
    # Engine(held_gpu_updates=...): with held updates (clipping), blocks whose AdamW runs on
    # the GPU when the next forward loads them: off | auto | N (blocks 1..N)
    held_gpu_updates: str = "off"
    seed: int = 0
    max_data_bytes: int = 3_000_000   # of the built-in corpus
    generate_tokens: int = 200
    extra: dict = field(default_factory=dict, repr=False)

    def validate(self) -> "TrainConfig":
        for name in ("seq_len", "batch_size", "max_steps", "grad_accum", "max_bad_steps"):
            if getattr(self, name) < 1:
                raise OutcoreError(f"{name}={getattr(self, name)} must be >= 1")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise OutcoreError(f"micro_batch_size={self.micro_batch_size} must be >= 1")
        if self.max_data_bytes < 1:
            raise OutcoreError(f"max_data_bytes={self.max_data_bytes} must be >= 1")
        for name in ("save_every", "keep_last", "warmup_steps", "generate_tokens"):
            if getattr(self, name) < 0:
                raise OutcoreError(f"{name}={getattr(self, name)} must be >= 0")
        for name, fix in (("model", "pass a reference size or a checkpoint directory"),
                          ("data", "pass a file or folder, or leave it out for the built-in "
                           "corpus"), ("output_dir", "pass a directory")):
            v = getattr(self, name)
            if isinstance(v, str) and not v.strip():
                raise OutcoreError(f"{name}={v!r} is empty: {fix}")
            if isinstance(v, str) and v.startswith("~"):   # a file's or a quoted path: the
                setattr(self, name, os.path.expanduser(v))   # shell's meaning of ~
        # torch.manual_seed takes 64 bits (negative ones as their two's complement)
        if not -(1 << 63) <= self.seed < (1 << 64):
            raise OutcoreError(f"seed={self.seed} does not fit in 64 bits: pass a seed in "
                               f"0..{(1 << 63) - 1}")
        check_budget(self.gpu_memory, "gpu_memory")   # a one-line error now, not at Engine()
        # NaN compares false both ways, so each test below also refuses it
        if not 0 < self.lr < math.inf:
            raise OutcoreError(f"lr={self.lr} must be a finite number > 0")
        if not 0 <= self.weight_decay < math.inf:
            raise OutcoreError(f"weight_decay={self.weight_decay} must be a finite number >= 0")
        if not 0 < self.eps < math.inf:
            raise OutcoreError(f"eps={self.eps} must be a finite number > 0")
        self.betas = check_betas(self.betas)
        if self.max_grad_norm is not None and not self.max_grad_norm < math.inf:
            raise OutcoreError(f"max_grad_norm={self.max_grad_norm} must be a finite number "
                               "(0: no clipping)")
        if self.max_grad_norm is not None and self.max_grad_norm < 0:
            raise OutcoreError(f"max_grad_norm={self.max_grad_norm} must be >= 0 (0: no "
                               "clipping)")
        if self.max_grad_norm == 0:
            self.max_grad_norm = None  # --max-grad-norm 0: no clipping
        if isinstance(self.host_weight_copy, bool):   # TrainConfig(...) built in code
            self.host_weight_copy = "cast" if self.host_weight_copy else "off"
        if self.host_weight_copy not in COPY_MODES:
            raise OutcoreError(f"host_weight_copy={self.host_weight_copy!r}: use "
                               f"{', '.join(COPY_MODES)}")
        self.held_gpu_updates = check_held(self.held_gpu_updates, self.max_grad_norm is not
                                           None or self.skip_nonfinite)
        if self.compute_dtype not in ("auto", "float32", "bfloat16", "tf32"):
            raise OutcoreError(f"compute_dtype={self.compute_dtype!r}: use auto, float32, "
                               "bfloat16 or tf32")
        return self


def check_betas(v) -> tuple[float, float]:
    """AdamW's (beta1, beta2): two numbers in [0, 1), else a one-line error."""
    ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in v)
    if not ok:
        raise OutcoreError(f"betas={v!r} must be two numbers in [0, 1), e.g. "
                           "betas = [0.9, 0.95]")
    return (float(v[0]), float(v[1]))


def check_held(v, held: bool) -> str:
    """--held-gpu-updates: "off", "auto" or a number of blocks >= 1 (as a string)."""
    v = str(v).strip().lower()
    if v == "0":
        v = "off"
    if v not in ("off", "auto") and not (v.isdigit() and int(v) >= 1):
        raise OutcoreError(f"held_gpu_updates={v!r}: use off, auto or a number of blocks >= 1")
    if v not in ("off", "auto") and not held:
        raise OutcoreError("held_gpu_updates needs held updates (clipping or skip_nonfinite); "
                           "without them the engine already updates blocks on the GPU")
    return v


def check_budget(value, what: str) -> int | None:
    """A memory budget ("24GiB", a byte count) in bytes, None for None. A number without a
    unit below 1 MiB is refused: "24" is 24 bytes, which no model fits, and was surely meant
    as 24 GiB."""
    from .units import parse_bytes
    n = parse_bytes(value, what)
    text = str(value).strip()
    if n is not None and n < (1 << 20) and not isinstance(value, bool) and \
            text.replace(".", "", 1).isdigit():
        raise OutcoreError(f"{what}={text} is {n} bytes, too small for any model: write the "
                           f"unit, e.g. {text}GiB or {text}GB (a plain byte count must be "
                           "1 MiB or more)")
    return n


def held_option(v: str) -> int | str:
    """TrainConfig.held_gpu_updates as Engine(held_gpu_updates=...) takes it."""
    return 0 if v == "off" else v if v == "auto" else int(v)


# --host-weight-copy's values: Engine(host_weight_copy=...)'s, by name
COPY_MODES = {"auto": "auto", "fused": "fused", "cast": True, "device": "device", "off": False}


# `train` options that are not TrainConfig keys: how the process is started
CLI_ONLY = {"nproc": "--nproc N", "config": "--config FILE"}


def config_keys() -> list[str]:
    return [f.name for f in fields(TrainConfig) if f.name != "extra"]


def load_toml(path: str | Path) -> dict:
    """The [train] table of a TOML file (or its top level), keys checked against TrainConfig."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OutcoreError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise OutcoreError(f"--config {path} is a directory: pass a TOML file") from None
    except OSError as e:
        raise OutcoreError(f"--config {path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise OutcoreError(f"--config {path} is not UTF-8 text: save it as UTF-8 TOML") \
            from None
    except tomllib.TOMLDecodeError as e:
        text = p.read_text(encoding="utf-8", errors="replace").lstrip()
        hint = (": the file must be TOML, not JSON: write key = value lines under [train], "
                "e.g. lr = 0.001" if p.suffix.lower() == ".json" or text.startswith("{")
                else "")
        raise OutcoreError(f"--config {path}: not valid TOML ({e}){hint}") from None
    table = data.get("train", data)
    if not isinstance(table, dict):
        raise OutcoreError(f"--config {path}: 'train' must be a table ([train] with "
                           f"key = value lines), got {table!r}")
    if "train" in data:   # anything beside [train] would be dropped without a word
        for k in data:
            if k != "train":
                raise OutcoreError(f"--config {path}: {k!r} is outside the [train] table, "
                                   "where outcore does not read it: move it under [train] "
                                   "(a key above [train] belongs to no table)")
    keys = config_keys()
    seen = {}
    for k in table:
        norm = k.replace("-", "_")
        if norm in CLI_ONLY:
            raise OutcoreError(f"--config {path}: {k!r} is a command-line option only: pass "
                               f"{CLI_ONLY[norm]} and leave it out of the file")
        if norm not in keys:
            close = difflib.get_close_matches(norm, keys, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(keys)}"
            raise OutcoreError(f"unknown config key {k!r} in {path}{hint}")
        if norm in seen:
            raise OutcoreError(f"--config {path}: {seen[norm]!r} and {k!r} are the same key "
                               "given twice: keep one")
        seen[norm] = k
    return {k.replace("-", "_"): v for k, v in table.items()}


def build(file_values: dict, flag_values: dict) -> TrainConfig:
    """TrainConfig from defaults, then the file, then flags that were given (not None)."""
    cfg = TrainConfig()
    merged = {**file_values, **{k: v for k, v in flag_values.items() if v is not None}}
    types = {f.name: f.type for f in fields(TrainConfig)}
    for k, v in merged.items():
        if k not in types:
            raise OutcoreError(f"unknown config key {k!r}")
        if k == "betas":
            v = check_betas(v)
        if k == "held_gpu_updates" and isinstance(v, int) and not isinstance(v, bool):
            v = str(v)   # `held_gpu_updates = 4` in a file, as --held-gpu-updates 4
        setattr(cfg, k, _check_type(k, types[k], v))
    return dataclasses.replace(cfg).validate()


def _check_type(key: str, typ, v):
    """v if it has the field's type (ints accepted for floats), else a one-line error."""
    t = str(typ)
    if v is None and "None" in t:
        return v
    if t.startswith("int") and (isinstance(v, bool) or not isinstance(v, int)):
        raise OutcoreError(f"config key {key!r} must be an integer, got {v!r}")
    if t.startswith("float") and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise OutcoreError(f"config key {key!r} must be a number, got {v!r}")
    if t.startswith("float"):
        return float(v)
    if t.startswith("str") and not isinstance(v, str):
        raise OutcoreError(f"config key {key!r} must be a string, got {v!r}")
    if t == "bool" and not isinstance(v, bool):
        raise OutcoreError(f"config key {key!r} must be true or false, got {v!r}")
    return v
