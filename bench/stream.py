"""Streaming trainer vs in-memory PyTorch vs FSDP2 CPU offload, on one GPU.

    PYTHONPATH=src python3 bench/stream.py                    # all cases: ~18 min, see below
    PYTHONPATH=src python3 bench/stream.py --cases 3b-16k,3b-64k --largest 0   # ~9 min
    PYTHONPATH=src python3 bench/stream.py --cases 1b-16k,7b-16k --append     # the rest
    PYTHONPATH=src python3 bench/stream.py --cases 3b-16k --systems outcore,pytorch
    PYTHONPATH=src python3 bench/stream.py --smoke            # CPU, seconds

Each (system, case) runs in its own subprocess so host and GPU memory start clean.
Same model (outcore.models.decoder), same random batch, same number of steps; the
figure is the median step time over the measured steps after warm-up.
Writes bench/results/stream-<machine>.json and stream-<machine>.png. A lent GPU machine
runs one command for at most 10 minutes: --append adds a command's cases to the file as
one more part (each part keeps its command and commit; each case's systems share a part).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from stream_record import appended, gpu_tests, part_of, plot, profile_steps  # noqa: E402,F401

CASES = {  # name: (model size, tokens per step, micro batch rows for outcore; 0 = whole)
    "1b-16k": ("1b", 16384, 0),
    "3b-16k": ("3b", 16384, 0),
    "7b-16k": ("7b", 16384, 0),
    "3b-64k": ("3b", 65536, 8),
}
SEQ = 2048
ALLOC_CONF = ""  # set from --alloc-conf
SETTLE = 3      # outcore's warm-up ends after this many steps with no planner move


def make_model(size: str, layers: int | None = None, fused_norm: bool = False,
               compiled: bool = False):
    from outcore.models import decoder
    kw = {"max_seq": SEQ, "fused_norm": fused_norm, "compiled": compiled}
    if layers:
        kw["layers"] = layers
    t = time.perf_counter()
    model = decoder(size, **kw)
    # the setup's stages in the log, so a run stopped by its limit shows where it was
    print(f"  model: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params built "
          f"in {time.perf_counter() - t:.1f} s", flush=True)
    return model


MODEL_SWITCHES = ("fused_norm", "compiled")   # the same model for every system
OUTCORE_SWITCHES = ("full_recompute", "tune_updates", "host_weight_copy", "device_weight_copy",
                    "settle_compiles", "no_keep_weights", "fused_copy", "no_host_weight_copy",
                    "lazy_copies", "rest_mv_on_h2d")


def switches(args, names) -> list[str]:
    """The command-line flags (--name-with-dashes) of the boolean options in `names` that
    are set: what a worker gets of this invocation's switches."""
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n)]


def model_flags(args) -> list[str]:
    """The model-variant flags every worker gets (the same model for every system)."""
    return switches(args, MODEL_SWITCHES)


def batch(vocab: int, tokens: int, seq: int, device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (tokens // seq, seq), generator=g)
    return {"input_ids": x.to(device), "labels": x.to(device)}


def run_outcore(args) -> dict:
    import outcore
    model = make_model(args.size, args.layers, args.fused_norm, args.compiled)
    n = sum(p.numel() for p in model.parameters())
    t_engine = time.perf_counter()
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=1e-4, weight_decay=0.0),
                         device="cuda", micro_batch_size=args.micro or None,
                         max_grad_norm=args.clip, held_gpu_updates=_held(args),
                         gpu_memory=args.gpu_memory,
                         gpu_updates=_gpu_updates(args),
                         host_weight_copy=_copy_mode(args),
                         keep_weights=not args.no_keep_weights,
                         block_slots=args.block_slots,
                         verbose=True)
    print(f"  engine: built in {time.perf_counter() - t_engine:.1f} s", flush=True)
    eng.runner.tail.enabled = not args.full_recompute
    if args.max_staged_grads is not None:   # 0: no cap (Engine.max_staged_grads = None)
        eng.max_staged_grads = args.max_staged_grads or None
    eng.schedule.order = args.cpu_order   # which staged gradient the CPU AdamW takes next
    from outcore.stream import cast_kernel   # how the AdamW pass writes the bf16 copies
    cast_kernel.STREAM_STORES = args.copy_stores == "stream"
    from outcore.stream import balance
    balance.MODEL = args.balance_model   # the balance planner's model of a step
    balance.CPU_RATE = args.cpu_rate      # and the CPU rate it plans with
    if args.balance_head is not None:     # the groups it keeps on the device (0: none)
        balance.HEAD = args.balance_head
    eng.updater.order = args.update_order   # which groups' AdamW moves to the GPU first
    eng.updater.lazy_copies = args.lazy_copies   # before any group moves (no 16-bit ring)
    eng.updater.resident_mv = args.resident_mv   # device blocks whose m, v stay there
    eng.updater.mv_on_compute = not args.rest_mv_on_h2d   # which pool rest's m, v are from
    if args.gpu_updates.isdigit():   # a fixed count: rest and N blocks in that order
        eng.updater.enable(eng.updater.candidates()[:int(args.gpu_updates) + 1])
    eng.updater.settle_compiles = args.settle_compiles
    if args.tune_updates:
        from outcore.stream.tune import UpdateTuner
        eng.updater.tuner = UpdateTuner(eng.updater, max_trials=args.tune_trials)
    b = batch(model.cfg.vocab, args.tokens, args.seq)
    times, split, losses = [], [], []

    def step(i: int) -> float:
        t = time.perf_counter()
        # train_step returns after its loss.item() (a sync of the compute stream); the
        # copies and updates it leaves running overlap the next step, as in training.
        losses.append(eng.train_step(b))
        dt = time.perf_counter() - t
        print(f"  step {i}: {dt:.3f} s loss {losses[-1]:.4f}", flush=True)
        return dt

    # Warm-up: at least --warmup steps, then on until the planner has left the device-
    # updated groups alone for SETTLE steps (at most --max-extra-warmup more): a move
    # inside the measured steps made 1b-16k's steps 0.19-0.37 s (session 5).
    i, changed_at, groups = 0, 0, set()
    tuner = eng.updater.tuner

    def unsettled() -> bool:   # the planner moved a group lately, or the tuner is trying
        return i - changed_at < SETTLE or (tuner is not None and tuner.busy())
    while i < args.warmup or (unsettled() and i < args.warmup + args.max_extra_warmup):
        step(i)
        i += 1
        if eng.updater.groups != groups:
            groups, changed_at = set(eng.updater.groups), i
    warmup, settled = i, not unsettled()
    torch.cuda.synchronize()
    t_window = time.perf_counter()
    measured_moves = 0   # measured steps after which the device groups changed anyway
    for i in range(warmup, warmup + args.steps):
        times.append(step(i))
        s = eng.stats
        split.append((s.compute_s, s.copy_wait_s, s.optimizer_wait_s, s.forward_s,
                      s.backward_s))
        if eng.updater.groups != groups:
            groups, measured_moves = set(eng.updater.groups), measured_moves + 1
    eng.synchronize()
    torch.cuda.synchronize()
    window = (time.perf_counter() - t_window) / args.steps
    if args.profile:
        profile_steps(lambda: eng.train_step(b), f"outcore-{args.size}-{args.tokens}")
    k = times.index(common.median(times))
    return {"params": n, "step_s": common.median(times), "window_step_s": window,
            "losses": losses, "warmup_steps": warmup,
            "plan_settled": settled,
            # a move the warm-up did not wait for (session 32's second 3b-16k run handed
            # 3 groups back after its last measured step but one)
            "measured_moves": measured_moves,
            "compute_s": split[k][0], "copy_wait_s": split[k][1],
            "optimizer_wait_s": split[k][2],
            # every measured step: a step's wall ends at its loss.item(), so work it left
            # running lands in the next one (session 13 saw 0.6 s steps among 0.85 s ones)
            "steps": [{"step_s": t, "compute_s": c, "copy_wait_s": w, "optimizer_wait_s": o,
                       "forward_s": f, "backward_s": bw}
                      for t, (c, w, o, f, bw) in zip(times, split)],
            # the compute stream's span from the step's start to backward's start, and
            # from there to backward's end (the same step as compute_s)
            "forward_s": split[k][3], "backward_s": split[k][4],
            # over every step (the engine resets the allocator's peak counters per block)
            "peak_gpu_gb": eng.stats.peak_reserved_bytes / 1e9,
            "peak_gpu_allocated_gb": eng.stats.peak_device_bytes / 1e9,
            "host_bytes_per_param": eng.host_bytes_per_param(),
            "device_updated_groups": sorted(eng.updater.groups),
            "alloc_retries": eng.stats.alloc_retries,
            "recompute_skips_tail_of_blocks": len(eng.runner.tail.skipping()),
            "checkpoint_bytes_offloaded": eng.stash.bytes_offloaded,
            "device_updated_params": sum(eng.groups[g].numel for g in eng.updater.groups),
            "clip": args.clip, "held_gpu_updates": args.held_gpu_updates,
            "update_tuning": eng.updater.tuner.log if eng.updater.tuner else None,
            "balance_log": eng.updater.balancer.log if eng.updater.balancer else None,
            "kept_blocks": eng.stats.kept_blocks,   # forward loads kept weights saved
            # the engine's copies as it resolved them ("auto": "fused" or False)
            "host_weight_copy": str(eng.host_weight_copy),
            "lazy_copies": eng.updater.lazy_copies,
            # the staging cap as the engine resolved it (None: no cap; validate.py)
            "staged_grads_cap": eng.max_staged_grads,
            # which staged gradient the CPU AdamW took next (stream/cpu_order.py)
            "cpu_update_order": eng.schedule.order,
            # the bf16 copies written by non-temporal stores (stream/cast_kernel.py)
            "copy_stream_stores": cast_kernel.STREAM_STORES,
            "resident_mv_blocks": eng.updater.resident.blocks(),
            "deferred_blocks": sorted(eng.deferred.groups),
            "deferred_params": sum(eng.groups[g].numel for g in eng.deferred.groups),
            "memory_by_stream": (memory_by_stream(eng.lanes) if torch.cuda.is_available()
                                 else None)}


def memory_by_stream(lanes) -> dict:
    """The allocator's segments at the run's end by the stream they belong to: what each
    stream holds reserved (a block freed on one stream is reused only by allocations on
    that stream; segments stay until the allocator frees cached ones at the budget's cap,
    so the sum can be below the reserved peak) and what is still allocated in them, in GB,
    with the segment count."""
    names = {getattr(lanes, n).cuda_stream: n for n in ("compute", "h2d", "d2h")}
    out: dict = {}
    for seg in torch.cuda.memory_snapshot():
        name = names.get(seg["stream"], f"stream {seg['stream']:#x}")
        row = out.setdefault(name, {"reserved_gb": 0.0, "allocated_gb": 0.0, "segments": 0})
        row["reserved_gb"] += seg["total_size"] / 1e9
        row["allocated_gb"] += seg["allocated_size"] / 1e9
        row["segments"] += 1
    return out


def _copy_mode(args):
    """Engine(host_weight_copy=...) from the four switches; none: the default, "auto"."""
    if args.no_host_weight_copy:
        return False
    if args.device_weight_copy:
        return "device"
    if args.fused_copy:
        return "fused"
    return True if args.host_weight_copy else "auto"


def _updates_arg(v: str) -> str:
    if v in ("balance", "auto") or v.isdigit():
        return v
    raise argparse.ArgumentTypeError(f"{v!r}: use balance, auto or a number of blocks")


def _gpu_updates(args):
    """Engine(gpu_updates=...): a planner's name, or 0 for a fixed count (enabled after the
    update order is set, run_outcore)."""
    return 0 if args.gpu_updates.isdigit() else args.gpu_updates


def _held(args):
    v = args.held_gpu_updates
    return int(v) if v.isdigit() else v


class _Ckpt(torch.nn.Module):
    """Activation checkpointing of one block for the in-memory baseline."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *a):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.inner, *a, use_reentrant=False)


def _plain_loop(model, opt, args, params) -> dict:
    b = batch(model.cfg.vocab, args.tokens, args.seq, "cuda")
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            torch.cuda.synchronize()
            t_window = time.perf_counter()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**b).loss
        loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # host sync, as outcore's train_step does
        dt = time.perf_counter() - t
        if i >= args.warmup:
            times.append(dt)
        print(f"  step {i}: {dt:.3f} s loss {losses[-1]:.4f}", flush=True)
    torch.cuda.synchronize()
    window = (time.perf_counter() - t_window) / args.steps
    return {"params": params, "step_s": common.median(times), "window_step_s": window,
            "losses": losses,
            "peak_gpu_gb": torch.cuda.max_memory_reserved() / 1e9}


def run_pytorch(args) -> dict:
    model = make_model(args.size, args.layers, args.fused_norm, args.compiled)
    n = sum(p.numel() for p in model.parameters())
    for i, layer in enumerate(model.layers):
        model.layers[i] = _Ckpt(layer)
    model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    out = _plain_loop(model, opt, args, n)
    if args.profile:
        b = batch(model.cfg.vocab, args.tokens, args.seq, "cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(**b).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        profile_steps(step, f"pytorch-{args.size}-{args.tokens}")
    out["host_bytes_per_param"] = 0.0
    return out


def run_fsdp2(args) -> dict:
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    model = make_model(args.size, args.layers, args.fused_norm, args.compiled)
    n = sum(p.numel() for p in model.parameters())
    for i, layer in enumerate(model.layers):
        model.layers[i] = _Ckpt(layer)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy(pin_memory=True)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp, offload_policy=off)
    fully_shard(model, mp_policy=mp, offload_policy=off)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    except RuntimeError:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    out = _plain_loop(model, opt, args, n)
    out["host_bytes_per_param"] = None  # FSDP2 does not report its host bytes
    dist.destroy_process_group()
    return out


def worker(args) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    fn = {"outcore": run_outcore, "pytorch": run_pytorch, "fsdp2": run_fsdp2}[args.system]
    try:
        res = fn(args)
        res["tokens_per_s"] = args.tokens / res["step_s"]
        res["model_tflops"] = 6 * res["params"] * args.tokens / res["step_s"] / 1e12
    except torch.cuda.OutOfMemoryError as e:
        res = {"error": f"out of memory: {str(e).splitlines()[0][:160]}"}
        # The whole message (allocated, reserved, cap) and where it was raised, to the log.
        print("out of memory: " + " ".join(str(e).split()))
        print("".join(traceback.format_tb(e.__traceback__)[-4:]))
    except Exception as e:  # a failed run is a row with its error, not a missing row
        res = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    print("RESULT " + json.dumps(res), flush=True)


def spawn(system: str, case: str, size: str, tokens: int, micro: int, extra: list[str],
          timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--system", system,
           "--size", size, "--tokens", str(tokens), "--micro", str(micro)] + extra
    t = time.time()
    env = dict(os.environ)
    if ALLOC_CONF:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF  # every system alike
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out = p.stdout
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        # where it was stopped: a run that had not reached its first step needs a longer
        # limit, not a faster engine (session 46's 7b-16k runs at 100 and 170 s)
        last = next((l.strip() for l in reversed(out.splitlines()) if l.strip()), "no output")
        out += "\nRESULT " + json.dumps({"error": f"timed out after {timeout:.0f} s, "
                                                   f"its last line: {last[:100]}"})
        p = None
    sys.stdout.write("".join(f"    {l}\n" for l in out.splitlines() if not l.startswith("RESULT")))
    res = next((json.loads(l[7:]) for l in reversed(out.splitlines()) if l.startswith("RESULT")),
               None)
    if res is None:
        err = (p.stderr if p else "")[-400:].strip().splitlines()
        res = {"error": f"worker died (rc={p.returncode if p else '?'}): "
                        f"{err[-1] if err else 'no output'}"}
    res.update({"system": system, "case": case, "wall_s_total": time.time() - t})
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--systems", default="outcore,pytorch,fsdp2")
    ap.add_argument("--largest", default="auto", help="layers of the 7b shape for the "
                    "'largest' row: auto (from host RAM), N, or 0 to skip")
    ap.add_argument("--gpu-memory", default="14.5GiB", help="outcore's device budget (the "
                    "3b-16k target is a peak <= 16 GB = 14.9 GiB)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=6, help="outcore settles its CPU/device "
                    "optimizer split over the first steps")
    ap.add_argument("--max-extra-warmup", type=int, default=12, help="outcore: warm-up "
                    "steps past --warmup while its planner still moves groups")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per (system, case)")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the code paths")
    ap.add_argument("--alloc-conf", default="expandable_segments:True",
                    help="PYTORCH_CUDA_ALLOC_CONF for every run ('' for torch's default)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-tests", action="store_true", help="do not run the GPU test "
                    "module (tests/stream/test_gpu.py) before the cases")
    ap.add_argument("--clip", type=float, default=None, help="max_grad_norm for every system "
                    "(outcore then holds its updates until the norm is known)")
    ap.add_argument("--held-gpu-updates", default="0", help="outcore's held_gpu_updates: 0, "
                    "auto or a number of blocks (needs --clip)")
    ap.add_argument("--append", action="store_true", help="add this run's rows to the "
                    "existing results file, as one more part (cases that take longer than "
                    "one 10-minute command together)")
    ap.add_argument("--fused-norm", action="store_true", help="every system's model "
                    "uses F.rms_norm (DecoderConfig.fused_norm) instead of the fp32 "
                    "elementwise RMSNorm")
    ap.add_argument("--compiled", action="store_true", help="every system's model runs "
                    "its blocks' elementwise parts through torch.compile "
                    "(DecoderConfig.compiled)")
    ap.add_argument("--tune-updates", action="store_true", help="outcore hands device-"
                    "updated groups back to the CPU while the step gets shorter "
                    "(stream/tune.py; from step 9, about 6 steps a trial: use --warmup 30)")
    ap.add_argument("--host-weight-copy", action="store_true", help="outcore keeps 16-bit "
                    "copies of the blocks' weights on the host and loads them where fp32 is "
                    "not needed (Engine(host_weight_copy=True); +2 B/param of host memory)")
    ap.add_argument("--device-weight-copy", action="store_true", help="as --host-weight-copy "
                    "for the device-updated blocks only (Engine(host_weight_copy='device')): "
                    "the CPU AdamW casts nothing, CPU-updated blocks load fp32")
    ap.add_argument("--no-host-weight-copy", action="store_true", help="outcore keeps no "
                    "16-bit copies (Engine(host_weight_copy=False); the default is 'auto': "
                    "fused copies where the host has room)")
    ap.add_argument("--fused-copy", action="store_true", help="as --host-weight-copy, the "
                    "CPU AdamW writing the copy in its own pass (Engine(host_weight_copy="
                    "'fused'): stream/cast_kernel.py, a C++ kernel built on first use)")
    ap.add_argument("--gpu-updates", type=_updates_arg, default="balance",
                    help="outcore's device-updated groups: from a model of the step's "
                    "queues, moved either way (balance, the default: stream/balance.py), "
                    "added while the step waits for the CPU (auto, the default before "
                    "session 8), or a fixed N: rest and N blocks in --update-order")
    ap.add_argument("--no-keep-weights", action="store_true", help="outcore does not keep "
                    "device-updated blocks' weights on the GPU for the next forward "
                    "(Engine(keep_weights=False); the default keeps them: stream/keep.py)")
    ap.add_argument("--lazy-copies", action="store_true", help="outcore's device updates "
                    "send no 16-bit copy to the host (A/B of DeviceUpdater.lazy_copies: 2 "
                    "B/param less out in backward's device-updated stretch)")
    ap.add_argument("--resident-mv", type=int, default=0, help="outcore: this many device-"
                    "updated blocks keep m and v on the GPU between steps (A/B of "
                    "DeviceUpdater.resident_mv: 16 B/param less over the link each, 8 B/param "
                    "of GPU memory)")
    ap.add_argument("--settle-compiles", action="store_true", help="outcore's device-update "
                    "planner skips steps in which torch.compile built kernels")
    ap.add_argument("--tune-trials", type=int, default=4, help="--tune-updates: groups "
                    "handed back at most (one trial of about 6 steps each)")
    ap.add_argument("--update-order", default="tail", choices=["tail", "interleave"],
                    help="outcore: which groups' AdamW moves to the GPU first (A/B of "
                    "DeviceUpdater.order)")
    ap.add_argument("--balance-model", default="queues", choices=["queues", "simulate"],
                    help="outcore: the balance planner's model of a step (A/B of "
                    "stream/balance.MODEL; session 12 ran 'simulate')")
    ap.add_argument("--balance-head", type=int, default=None, help="outcore: the groups "
                    "(rest, blocks 1..N-1) the balance planner keeps on the device where "
                    "that costs little (default: stream/balance.HEAD; 0: the rule before "
                    "session 17)")
    ap.add_argument("--rest-mv-on-h2d", action="store_true", help="rest's m, v for its "
                    "device update allocated on the h2d stream, in its own pool (outcore's "
                    "DeviceUpdater.mv_on_compute off; the rule until session 34)")
    ap.add_argument("--block-slots", type=int, default=3, help="outcore's Engine(block_slots"
                    "=N): N - 2 blocks loaded ahead (opt-in; session 13's A/B: no faster)")
    ap.add_argument("--cpu-rate", default="last", choices=["last", "best"],
                    help="outcore: the CPU AdamW rate the balance planner uses, the highest "
                    "measured or the last (A/B of stream/balance.CPU_RATE)")
    ap.add_argument("--max-staged-grads", type=int, default=None, help="outcore: gradients "
                    "that may wait in pinned host memory for the CPU AdamW before backward "
                    "waits (Engine.max_staged_grads; 0: no cap; default: the engine's, at least 8, "
                    "none where the host has room: validate.resolve_staged_cap)")
    ap.add_argument("--cpu-order", default="arrival", choices=["arrival", "need"],
                    help="outcore: which staged gradient the CPU AdamW takes next, the oldest "
                    "or the one the next forward needs first (stream/cpu_order.py)")
    ap.add_argument("--copy-stores", default="cached", choices=["cached", "stream"],
                    help="outcore: the CPU AdamW pass writes the bf16 copies by ordinary or "
                    "non-temporal stores (stream/cast_kernel.STREAM_STORES)")
    ap.add_argument("--full-recompute", action="store_true", help="outcore recomputes each "
                    "block's last projection too (A/B of stream/tail.py)")
    ap.add_argument("--profile", action="store_true", help="also profile two steps of "
                    "outcore and pytorch per case (results/stream-profile-*.txt)")
    # worker-only
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--size", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--micro", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, default=SEQ, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tune_updates and args.gpu_updates != "auto":
        ap.error("--tune-updates tunes the auto planner's moves: add --gpu-updates auto")
    if args.worker:
        return worker(args)
    unknown = [c for c in filter(None, args.cases.split(",")) if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}: choose from {', '.join(CASES)}")
    if args.smoke:
        return smoke()
    global ALLOC_CONF
    ALLOC_CONF = args.alloc_conf
    name = args.out or f"stream-{common.machine_name()}"
    doc = common.header("stream")
    if args.append:
        doc = appended(doc, name)
    doc["alloc_conf"] = ALLOC_CONF or "default"
    doc["timing"] = ("step_s: median wall time of one step (ending at its loss.item()) over "
                     "the measured steps after warm-up; window_step_s: the measured steps' "
                     "total between two full device synchronizations, per step")
    extra = ["--steps", str(args.steps), "--warmup", str(args.warmup),
             "--max-extra-warmup", str(args.max_extra_warmup),
             "--gpu-memory", args.gpu_memory, "--held-gpu-updates", args.held_gpu_updates,
             "--update-order", args.update_order, "--tune-trials", str(args.tune_trials),
             "--gpu-updates", args.gpu_updates, "--balance-model", args.balance_model,
             "--cpu-rate", args.cpu_rate, "--block-slots", str(args.block_slots),
             "--resident-mv", str(args.resident_mv), "--cpu-order", args.cpu_order,
             "--copy-stores", args.copy_stores] \
        + (["--max-staged-grads", str(args.max_staged_grads)]
           if args.max_staged_grads is not None else []) \
        + (["--balance-head", str(args.balance_head)] if args.balance_head is not None
           else []) \
        + (["--clip", str(args.clip)] if args.clip else []) \
        + switches(args, ("profile",) + OUTCORE_SWITCHES) + model_flags(args)
    for k in ("clip", "held_gpu_updates", "update_order", "gpu_updates",
              "balance_model", "cpu_rate", "block_slots", "resident_mv",
              "max_staged_grads", "cpu_order", "copy_stores") + OUTCORE_SWITCHES \
            + MODEL_SWITCHES:
        doc[k] = getattr(args, k)
    from outcore.stream import balance
    doc["balance_head"] = balance.HEAD if args.balance_head is None else args.balance_head
    doc["compute_bound"] = balance.COMPUTE_BOUND
    if not args.skip_tests:
        doc["gpu_tests"] = gpu_tests()
        if "parts" in doc:
            doc["parts"][-1]["gpu_tests"] = doc["gpu_tests"]
        common.write(doc, name)
    for case in filter(None, args.cases.split(",")):   # --cases "" runs only --largest
        size, tokens, micro = CASES[case]
        for system in args.systems.split(","):
            print(f"== {system} {case}", flush=True)
            doc["runs"].append(spawn(system, case, size, tokens, micro, extra, args.timeout)
                               | part_of(doc))
            common.write(doc, name)
    if args.largest != "0" and "outcore" in args.systems:
        layers = largest_layers() if args.largest == "auto" else int(args.largest)
        print(f"== outcore largest ({layers} layers of the 7b shape)", flush=True)
        # No host copies: the row is sized for HOST_BYTES_PER_PARAM, measured without them
        # (they add 2 B/param; "auto" might take them where the host check passes narrowly)
        r = spawn("outcore", "largest", "7b", 16384, 0,
                  ["--steps", "3", "--warmup", "1", "--gpu-memory", args.gpu_memory,
                   "--layers", str(layers), "--no-host-weight-copy"] + model_flags(args),
                  args.timeout * 2)
        losses = r.get("losses") or []
        r["loss_falls"] = bool(losses) and losses[-1] < losses[0]
        doc["runs"].append(r | part_of(doc))
    common.write(doc, name)
    plot(doc, common.RESULTS / f"{name}.png", CASES)
    print(common.table(doc["runs"], ["system", "case", "tokens_per_s", "model_tflops",
                                     "peak_gpu_gb", "host_bytes_per_param", "compute_s",
                                     "copy_wait_s", "forward_s", "backward_s",
                                     "optimizer_wait_s", "error"]))


# The outcore process's peak RSS per parameter as measured on the H200 (session 6 rows:
# 3b-16k 15.1, 3b-64k 15.5, 7b-16k 14.8): the fp32 master and AdamW state are 12, the rest
# is the pinned checkpoint pool, gradient staging and the CUDA and torch libraries. At 12.5
# the largest row (8.56B, 41 layers) was killed for host memory after 4 steps.
HOST_BYTES_PER_PARAM = 15.5


def largest_layers() -> int:
    """Layers of the 7b shape (202M params each) that fit HOST_BYTES_PER_PARAM in 85% of
    host RAM."""
    import outcore.models as m
    cfg = m.SIZES["7b"]
    per_layer = (cfg.num_params() - 2 * cfg.vocab * cfg.dim) / cfg.layers
    avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    budget = 0.85 * avail / HOST_BYTES_PER_PARAM - 2 * cfg.vocab * cfg.dim
    return max(1, int(budget // per_layer))


def smoke() -> None:
    """Every code path of the worker on the CPU with a tiny model (no GPU needed)."""
    import outcore
    from outcore.models import decoder
    model = decoder("tiny")
    eng = outcore.Engine(model, device="cpu", micro_batch_size=2)
    b = batch(model.cfg.vocab, 4 * 64, 64)
    losses = [eng.train_step(b) for _ in range(3)]
    eng.close()
    assert losses[-1] < losses[0], losses
    print(common.table([{"system": "outcore", "case": "smoke", "loss0": losses[0],
                         "loss2": losses[-1]}], ["system", "case", "loss0", "loss2"]))


if __name__ == "__main__":
    main()
