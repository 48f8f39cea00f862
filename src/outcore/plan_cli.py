"""`outcore plan`: where a model's state will live, whether it fits, how fast a step is."""

from __future__ import annotations

from .errors import OutcoreError


def register(sub) -> None:
    p = sub.add_parser("plan", help="will a model fit this GPU and host, and how fast "
                       "(allocates nothing large)")
    p.add_argument("--model", required=True, help="reference size (tiny .. 70b) or a local "
                   "Hugging Face checkpoint directory")
    p.add_argument("--gpu-memory", help="device budget, e.g. 24GiB (default: this GPU's "
                   "memory; none on a CPU-only machine)")
    p.add_argument("--host-memory", help="host budget, e.g. 256GiB (default: available now)")
    p.add_argument("--tokens-per-step", type=int, default=65536)
    p.add_argument("--micro-tokens", type=int, help="tokens per micro-batch (default: "
                   "the whole step, halved until it fits the GPU budget)")
    p.add_argument("--compute-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--no-clip", action="store_true", help="no gradient clipping: 12 host "
                   "B/param instead of 16")
    p.add_argument("--held-gpu-updates", default="off", help="as `train --held-gpu-updates`"
                   ": with clipping, blocks updated on the GPU by their next load (off, auto, N)")
    p.add_argument("--host-weight-copy", nargs="?", const="on", default="auto",
                   choices=["auto", "on", "off"], help="16-bit copies of the weights on the "
                   "host (+2 B/param; bfloat16 only): auto (default, as `train` decides: on a "
                   "GPU with bf16 compute, no held GPU updates and host room to spare), on, off")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence, for the "
                   "timed block's attention (default 2048)")
    p.add_argument("--compile-kernels", action="store_true", help="time the block with its "
                   "torch.compile'd kernels, as `train --compile-kernels` runs it")
    p.add_argument("--device", default="auto", help="device to calibrate: auto, cpu, cuda:N")
    p.add_argument("--no-calibrate", action="store_true", help="skip the step-time estimate")
    p.set_defaults(func=_run)


def _run(args) -> int:
    import torch

    from .models import SIZES
    from .calibration import calibrate
    from .planner import host_available, make_plan, model_shape
    if args.tokens_per_step < 1 or (args.micro_tokens is not None and args.micro_tokens < 1) \
            or args.seq_len < 1:
        raise OutcoreError("--tokens-per-step, --micro-tokens and --seq-len must be >= 1")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    from .stream.validate import resolve_device
    resolve_device(device)   # a one-line error for a device that is not here
    from .config import check_budget, check_held, held_option
    gpu = check_budget(args.gpu_memory, "--gpu-memory")
    if gpu is None and device.startswith("cuda"):
        gpu = torch.cuda.get_device_properties(device).total_memory
    host = check_budget(args.host_memory, "--host-memory") or host_available()
    if args.no_clip and check_held(args.held_gpu_updates, True) != "off":
        raise OutcoreError("--held-gpu-updates needs clipping (held updates): leave out "
                           "--no-clip, or --held-gpu-updates (without clipping the engine "
                           "already updates a measured share of blocks on the GPU)")
    held = held_option(check_held(args.held_gpu_updates, not args.no_clip))
    if args.host_weight_copy == "on" and args.compute_dtype != "bfloat16":
        raise OutcoreError("--host-weight-copy on keeps 16-bit copies for a 16-bit compute: "
                           "pass --compute-dtype bfloat16, or leave --host-weight-copy out")
    shape = model_shape(args.model)
    dtype = getattr(torch, args.compute_dtype)
    calib = None if args.no_calibrate else calibrate(device, dtype)
    block_s = None
    if calib is not None and args.model in SIZES:
        from dataclasses import replace

        from .plan_step import block_seconds
        cfg = replace(SIZES[args.model], compiled=args.compile_kernels,
                      max_seq=max(SIZES[args.model].max_seq, args.seq_len))
        block_s = block_seconds(cfg, device, dtype, args.micro_tokens or args.tokens_per_step,
                                args.seq_len, calib.flops)
    plan = make_plan(shape, tokens_per_step=args.tokens_per_step, micro_tokens=args.micro_tokens,
                     gpu_limit=gpu, host_limit=host, clip=not args.no_clip,
                     compute_itemsize=dtype.itemsize, calib=calib,
                     host_copy=_copies(args.host_weight_copy, device, dtype, held, shape,
                                       host, not args.no_clip),
                     block_s_per_token=block_s, held_gpu_updates=held)
    if calib is not None:
        h2d = f", host->device {calib.h2d / 1e9:.1f} GB/s" if calib.h2d else ""
        print(f"calibration ({device}): matmul {calib.flops / 1e12:.2f} TFLOP/s "
              f"({args.compute_dtype}), host memcpy {calib.host_copy / 1e9:.1f} GB/s{h2d}, "
              f"CPU AdamW {calib.adamw / 1e9:.2f} G params/s"
              + (f" ({calib.adamw_loaded / 1e9:.2f} under copies both ways)"
                 if calib.adamw_loaded else ""))
    print("\n".join(plan.lines()))
    why = plan.refusal(micro_flag="--micro-tokens", tokens_flag="--tokens-per-step")
    if why:
        print(f"why: {why}")
    return 0 if plan.fits else 1


def _copies(choice: str, device: str, dtype, held, shape, host: int | None,
            clip: bool) -> bool:
    """Whether the plan has 16-bit host copies: "auto" as Engine(host_weight_copy="auto")
    resolves it for `outcore train` (stream/validate.resolve_copy_option): a CUDA device,
    bf16, no held GPU updates, and host room for the state, the copies and
    AUTO_COPY_MARGIN B/param to spare."""
    if choice != "auto":
        return choice == "on" and dtype.itemsize == 2
    from .stream.validate import AUTO_COPY_MARGIN
    if not device.startswith("cuda") or dtype.itemsize != 2 or held:
        return False
    need = ((16 if clip else 12) + 2 + AUTO_COPY_MARGIN) * shape.params
    return host is None or need <= host
