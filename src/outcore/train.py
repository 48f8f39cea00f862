"""`outcore train`: plan, build the model and data, run the loop, checkpoint, log.

The loop in one screen: for each step, set the lr (warmup + cosine), take the batch of that
step (a pure function of seed and step, so the step count is the data position), one
engine step (micro-batches of --batch-size summed over --grad-accum), log a row, save when
due or when SIGTERM/SIGINT arrived. A non-finite loss or gradient norm skips the update;
--max-bad-steps of them in a row stop the run.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm

from . import runckpt
from .config import COPY_MODES, TrainConfig, held_option
from .data import ByteTokenizer
from .errors import OutcoreError
from .hf import is_hf_dir
from .memory import host_peak_rss_bytes
from .stream import AdamW, Engine
from .train_build import build_data, build_model, generate
from .train_signals import StopSignals
from .units import fmt_bytes, parse_bytes


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to cfg.lr, then cosine decay to 10% of it at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _device(cfg: TrainConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    from .stream.validate import resolve_device
    resolve_device(cfg.device)   # a one-line error for a device that is not here
    return cfg.device


def _distributed() -> bool:
    """Under torchrun (--nproc N): the CLI has joined the process group."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    """This process's rank under torchrun, else 0: only rank 0 prints, logs and samples."""
    import torch.distributed as dist
    return dist.get_rank() if _distributed() else 0


def _dtype(cfg: TrainConfig, device: str):
    if cfg.compute_dtype == "auto":
        return None
    if cfg.compute_dtype == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return torch.float32
    return getattr(torch, cfg.compute_dtype)


def check_plan(cfg: TrainConfig, device: str):
    """The planner's verdict before anything large is allocated; raises when it cannot fit."""
    from .planner import host_available, make_plan, model_shape
    shape = model_shape(cfg.model)
    gpu = None
    if device.startswith("cuda"):
        gpu = parse_bytes(cfg.gpu_memory, "gpu_memory") or \
            torch.cuda.get_device_properties(device).total_memory
    itemsize = 4 if cfg.compute_dtype in ("float32", "tf32") or not device.startswith("cuda") \
        else 2
    # clip: the trainer holds every gradient until the step's norm is known (to clip, and
    # to skip a non-finite step whole): 16 host bytes/param; else 12 and a few staged blocks
    plan = make_plan(shape, tokens_per_step=cfg.batch_size * cfg.grad_accum * cfg.seq_len,
                     micro_tokens=(cfg.micro_batch_size or cfg.batch_size) * cfg.seq_len,
                     gpu_limit=gpu, host_limit=host_available(),
                     clip=cfg.max_grad_norm is not None or cfg.skip_nonfinite,
                     compute_itemsize=itemsize,
                     # "auto" takes copies only where the host has room to spare
                     host_copy=cfg.host_weight_copy not in ("auto", "off") and itemsize == 2)
    why = plan.refusal()
    if why:
        raise OutcoreError(f"refusing to start: {why}")
    return plan


def _resume(cfg, ck: Path, model, data, kw, say) -> Engine:
    st = json.loads((ck / "trainer.json").read_text())
    if st.get("data_fingerprint") != data.fingerprint:
        raise OutcoreError(f"--resume: {ck} was trained on other data (or another tokenizer): "
                           "use the same --data, or a new --output-dir")
    changed = runckpt.optimizer_changes(ck, cfg)
    try:   # kw's optimizer: cfg's AdamW settings, which apply from here as --lr does
        engine = Engine.load(ck / "outcore", model, **kw)
    except OutcoreError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, EOFError, SafetensorError) as e:
        # damage that runckpt.problem's header checks cannot see (inside the tensors' data)
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OutcoreError(f"--resume: {ck} does not load ({text}): delete it to resume "
                           "from an older checkpoint") from None
    say(f"resumed from {ck} at step {engine.step_count}")
    if changed:
        say(f"--resume: {', '.join(changed)}: the new settings apply from step "
            f"{engine.step_count + 1}")
    return engine


def run(cfg: TrainConfig, loss_fn=None, return_model: bool = False) -> dict:
    """Train per cfg; returns the summary dict that is also printed.

    loss_fn: passed to engine.train_step (tests inject non-finite losses through it).
    return_model: add the trained model (fp32 masters) under "model".
    """
    cfg.validate()   # also when built in code, not by config.build
    torch.manual_seed(cfg.seed)
    out_dir = Path(cfg.output_dir)
    main = _rank() == 0
    say = print if main else (lambda *a, **k: None)   # only rank 0 prints
    device = _device(cfg)
    plan = check_plan(cfg, device)
    runckpt.check_output_dir(out_dir, cfg.resume)   # before anything large is built
    ck = runckpt.pick_resume(out_dir, say, _distributed()) if cfg.resume else None
    if ck is not None:
        runckpt.check_resume(ck, cfg)   # batches, seed, model: before anything is built
        at = json.loads((ck / "trainer.json").read_text())["step"]
        if at >= cfg.max_steps:
            say(f"--resume: {ck} is already at step {at} >= --max-steps {cfg.max_steps}: "
                "nothing to train (raise --max-steps to continue)")
            return {"steps": 0, "checkpoint": str(ck), "stopped_by_signal": None}
    model, tok, init = build_model(cfg)
    hf = is_hf_dir(cfg.model)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    data = build_data(cfg, tok, vocab)
    global_batch = cfg.batch_size * cfg.grad_accum
    micro = cfg.micro_batch_size or (cfg.batch_size if cfg.grad_accum > 1 else None)
    kw = dict(device=device, compute_dtype=_dtype(cfg, device), micro_batch_size=micro,
              max_grad_norm=cfg.max_grad_norm, gpu_memory=cfg.gpu_memory,
              skip_nonfinite=cfg.skip_nonfinite,
              host_weight_copy=COPY_MODES[cfg.host_weight_copy],
              keep_weights=cfg.keep_weights, verbose=main,
              held_gpu_updates=held_option(cfg.held_gpu_updates))
    kw["optimizer"] = AdamW(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                            weight_decay=cfg.weight_decay)
    engine = _resume(cfg, ck, model, data, kw, say) if ck is not None else None
    if engine is None:
        engine = Engine(model, init=init, **kw)
    out_dir.mkdir(parents=True, exist_ok=True)
    if main:
        (out_dir / "config.json").write_text(json.dumps({k: v for k, v in vars(cfg).items()
                                                         if k != "extra"}, default=str, indent=1))
    from .logs import NoLog, RunLog
    from .calibration import matmul_rate
    log = RunLog(out_dir, engine.step_count, tensorboard=cfg.tensorboard) if main else NoLog()
    peak_flops = matmul_rate(device, engine.compute_dtype)  # for MFU
    tokens_per_step = global_batch * cfg.seq_len

    def trainer_state(step: int) -> dict:
        return {"step": step, "data_fingerprint": data.fingerprint, "global_batch": global_batch,
                "seq_len": cfg.seq_len, "seed": cfg.seed, "model": cfg.model}

    def save(path: Path) -> None:
        runckpt.save_run(path, engine, tok, trainer_state(engine.step_count), hf)

    losses, times, bad, skipped_total = [], [], 0, 0
    start = engine.step_count
    engine.synchronize()   # a resumed engine's timings so far are not this run's
    base = (engine.stats.total_compute_s, engine.stats.total_copy_wait_s,
            engine.stats.total_optimizer_wait_s)
    stopped_by = None
    bar = tqdm(total=cfg.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True,
               disable=not main)
    note = tqdm.write if main else (lambda *a, **k: None)
    t_run = time.perf_counter()
    with StopSignals(quiet=not main) as sig:
        for step in range(start, cfg.max_steps):
            lr = lr_at(cfg, step)
            engine.set_lr(lr)
            loss = engine.train_step(data.batch(step, global_batch), loss_fn=loss_fn)
            skipped = getattr(engine, "last_step_skipped", False) or not math.isfinite(loss)
            bad = bad + 1 if skipped else 0
            skipped_total += skipped
            if skipped:
                what = "update skipped" if cfg.skip_nonfinite else \
                    "the groups with a non-finite gradient were left as they were"
                note(f"outcore: step {step + 1}: non-finite loss or gradient "
                     f"(loss {loss}): {what} ({bad} in a row)")
            else:
                losses.append(loss)
            times.append(engine.stats.step_s)
            tok_s = tokens_per_step / engine.stats.step_s
            log.write({"step": step + 1, "loss": loss if math.isfinite(loss) else None,
                       "lr": lr, "grad_norm": getattr(engine, "last_grad_norm", None)
                       if cfg.max_grad_norm else None, "skipped": int(skipped),
                       "tokens_per_s": tok_s, "mfu": 6 * engine.num_params * tok_s / peak_flops,
                       "step_s": engine.stats.step_s, "compute_s": engine.stats.compute_s,
                       "copy_wait_s": engine.stats.copy_wait_s,
                       "optimizer_wait_s": engine.stats.optimizer_wait_s,
                       "host_rss_bytes": host_peak_rss_bytes(),
                       "gpu_peak_bytes": engine.stats.peak_device_bytes})
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}")
            bar.update(1)
            if bad >= cfg.max_bad_steps:
                bar.close()
                log.close()
                engine.close()
                unchanged = "the weights are unchanged by them" if cfg.skip_nonfinite else \
                    "groups with a non-finite gradient were not updated"
                raise OutcoreError(f"{bad} steps in a row had a non-finite loss or gradient "
                                   f"(the last at step {step + 1}); {unchanged}: lower --lr, "
                                   "check the data, or resume from the last checkpoint")
            done = step + 1
            if sig.received is not None:
                stopped_by = sig.received
                if done == cfg.max_steps:
                    break   # the last step: its checkpoint is final/, written below
                save(runckpt.step_dir(out_dir, done))
                if main:
                    runckpt.prune(out_dir, cfg.keep_last)
                note(f"outcore: saved {runckpt.step_dir(out_dir, done)}; "
                     "continue with --resume")
                break
            if cfg.save_every and done % cfg.save_every == 0 and done < cfg.max_steps:
                save(runckpt.step_dir(out_dir, done))
                if main:
                    runckpt.prune(out_dir, cfg.keep_last)
                log.flush()
        bar.close()
        wall = time.perf_counter() - t_run
        if stopped_by is None or engine.step_count >= cfg.max_steps:
            save(out_dir / "final")
    log.close()
    engine.synchronize()   # the last steps' device timings settle (and every update lands)
    st = engine.stats
    split = {"compute_s": st.total_compute_s - base[0], "copy_wait_s": st.total_copy_wait_s
             - base[1], "optimizer_wait_s": st.total_optimizer_wait_s - base[2]}
    steady = sorted(times[1:] or times)
    summary = {
        "steps": engine.step_count - start, "skipped_steps": skipped_total,
        "first_loss": losses[0] if losses else float("nan"),
        "last_loss": losses[-1] if losses else float("nan"),
        "tokens_per_s": tokens_per_step / steady[len(steady) // 2] if steady else 0.0,
        "wall_s": wall, "params": engine.num_params,
        "host_peak_bytes": host_peak_rss_bytes(),
        "device_peak_bytes": engine.stats.peak_device_bytes,
        "host_bytes_per_param": engine.host_bytes_per_param(), **split,
        "checkpoint": str(runckpt.newest(out_dir)), "stopped_by_signal": stopped_by,
        "planned_host_bytes": plan.host_state_bytes,
    }
    if (stopped_by is None and cfg.generate_tokens and isinstance(tok, ByteTokenizer)
            and engine.num_params < 50e6):
        model = engine.model   # collective with --nproc N: every rank gathers the weights
        text = generate(model, tok, "def ", cfg.generate_tokens) if main else ""
        if text is None:
            say("outcore: no sample: the weights or logits are not finite (the run diverged: "
                "lower --lr)")
        elif main:
            print("--- sample ---\n" + text + "\n--------------")
    if main:
        print_summary(summary, device)
    if return_model:
        summary["model"] = engine.model
    engine.close()
    if hasattr(engine, "comm"):
        # Sync: the ranks leave together, not the others first while rank 0 (host of the
        # rendezvous store) still samples and prints
        engine.comm.barrier()
    return summary


def print_summary(s: dict, device: str) -> None:
    dev_peak = fmt_bytes(s["device_peak_bytes"]) if device.startswith("cuda") else "n/a (CPU)"
    total = s["compute_s"] + s["copy_wait_s"] + s["optimizer_wait_s"]
    print(f"summary: {s['steps']} steps ({s['skipped_steps']} skipped), loss "
          f"{s['first_loss']:.3f} -> {s['last_loss']:.3f}, "
          f"{s['tokens_per_s']:,.0f} tokens/s (median step), {s['wall_s']:.1f} s wall\n"
          f"  memory: host peak {fmt_bytes(s['host_peak_bytes'])}, device peak {dev_peak}, "
          f"{s['host_bytes_per_param']:.1f} host bytes/param for {s['params'] / 1e6:.1f}M params\n"
          f"  time: block compute {s['compute_s']:.1f} s, copy wait {s['copy_wait_s']:.1f} s, "
          f"optimizer wait {s['optimizer_wait_s']:.1f} s (of {total:.1f} s accounted)\n"
          f"  checkpoint: {s['checkpoint']}")
