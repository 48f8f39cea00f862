"""The `outcore` command: train (the default, and the demo), plus the capabilities' tools."""

from __future__ import annotations

import argparse
import os
import re
import sys

from .errors import OutcoreError


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a decoder LM with host-resident state "
                       "(no arguments: the demo)")
    p.add_argument("--config", help="TOML file with any of the keys below ([train] table)")
    p.add_argument("--model", help="reference size (tiny, small, 125m .. 70b) or a local "
                   "Hugging Face checkpoint directory")
    p.add_argument("--data", help="text file, folder of them, or JSONL ({'text'} or "
                   "{'prompt','response'}); default: the Python stdlib sources")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--grad-accum", type=int, help="micro steps of --batch-size summed into "
                   "one update")
    p.add_argument("--lr", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--max-grad-norm", type=float, help="global-norm clipping (default 1.0; "
                   "0: none)")
    p.add_argument("--no-skip-nonfinite", dest="skip_nonfinite", action="store_false",
                   default=None, help="do not hold every update for the whole step's gradient: "
                   "with --max-grad-norm 0, updates start block by block and part of them run "
                   "on the GPU (faster); a group with a non-finite gradient is left as it was "
                   "and the others update")
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--save-every", type=int, help="checkpoint every N steps (also on "
                   "SIGTERM/SIGINT and at the end)")
    p.add_argument("--keep-last", type=int, help="periodic checkpoints to keep (0 = all)")
    p.add_argument("--max-bad-steps", type=int, help="non-finite steps in a row that stop "
                   "the run (default 5)")
    p.add_argument("--no-tensorboard", dest="tensorboard", action="store_false", default=None)
    # the other half of each on/off pair: over a config file's value (flags win)
    p.add_argument("--tensorboard", dest="tensorboard", action="store_true", default=None,
                   help="TensorBoard logs (the default), over a config file's false")
    p.add_argument("--skip-nonfinite", dest="skip_nonfinite", action="store_true",
                   default=None, help="the default, over a config file's false")
    p.add_argument("--keep-weights", dest="keep_weights", action="store_true", default=None,
                   help="the default, over a config file's false")
    p.add_argument("--no-compile-kernels", dest="compile_kernels", action="store_false",
                   default=None, help="over a config file's compile_kernels = true")
    p.add_argument("--output-dir")
    p.add_argument("--resume", action="store_true", default=None)
    p.add_argument("--no-resume", dest="resume", action="store_false", default=None,
                   help="over a config file's resume = true")
    p.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--gpu-memory", help="device memory budget, e.g. 24GiB")
    p.add_argument("--compute-dtype", choices=["auto", "float32", "bfloat16", "tf32"])
    p.add_argument("--compile-kernels", action="store_true", default=None,
                   help="reference sizes: the blocks' elementwise parts as torch.compile'd "
                   "kernels (faster on a GPU; a compile of a few seconds to a minute first)")
    p.add_argument("--host-weight-copy", choices=["auto", "fused", "cast", "device", "off"],
                   help="16-bit copies of the blocks' weights on the host, loaded where fp32 "
                   "is not needed (bf16 compute; +2 B/param of host memory): auto (default: "
                   "fused on a GPU with host room to spare, else off), fused (written in the "
                   "AdamW pass), cast (after it), device (device-updated blocks only), off")
    p.add_argument("--no-keep-weights", dest="keep_weights", action="store_false",
                   default=None, help="do not keep the device-updated blocks' weights on the "
                   "GPU for the next forward (kept by default: they share the checkpoints' room)")
    p.add_argument("--held-gpu-updates", help="with clipping (held updates): off (default), "
                   "auto, or N: blocks 1..N updated on the GPU as the next forward loads them")
    p.add_argument("--seed", type=int)
    p.add_argument("--nproc", type=_at_least_one, help="data-parallel ranks on this machine "
                   "(re-runs itself as N processes; host state sharded over them)")
    p.set_defaults(func=_run_train)


def _at_least_one(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {n})")
    return n


def _run_train(args) -> int:
    from . import config, train
    from .parallel.launch import init_distributed, relaunch, shutdown, under_torchrun
    flags = {k: v for k, v in vars(args).items()
             if k not in ("func", "config", "command", "nproc", "argv", "flag_names")}
    args.uniform_error = True   # an error from here to the build: every rank's alike (_say)
    file_values = config.load_toml(args.config) if args.config else {}
    for key in file_values:   # errors keep a file's spelling for the keys it set and no
        if flags.get(key) is None:   # flag overrode (as_flags)
            args.flag_names.pop(key, None)
    cfg = config.build(file_values, flags)   # config mistakes: one line, before any rank
    args.uniform_error = False
    if args.nproc and args.nproc > 1 and not under_torchrun():
        if cfg.batch_size * cfg.grad_accum < args.nproc:   # else every rank fails at step 1
            raise OutcoreError(f"--nproc {args.nproc}: a batch of {cfg.batch_size} x "
                               f"{cfg.grad_accum} rows cannot be split over {args.nproc} "
                               "ranks: raise --batch-size or lower --nproc")
        # the ranks get the same arguments (--nproc included: under torchrun it only
        # says "distributed"), so no spelling of it (--nproc=2, --npr 2) is lost or kept
        return relaunch(args.nproc, getattr(args, "argv", None) or ["train"])
    if not under_torchrun():
        summary = train.run(cfg)
    else:
        init_distributed()  # Engine(...) then shards its state over the ranks
        try:
            summary = train.run(cfg)
        except BaseException:
            shutdown(barrier=False)   # a peer may be in another collective, or gone
            raise
        shutdown()
    sig = summary.get("stopped_by_signal")
    return 128 + sig if sig else 0  # the shell's convention for "ended by a signal"


def _flag_names(parser: argparse.ArgumentParser, args) -> dict[str, str]:
    """{dest: its flag} for the options of the subcommand that ran (--tensorboard for
    `tensorboard`, not --no-tensorboard)."""
    sub = next((a.choices.get(args.command) for a in parser._actions
                if isinstance(a, argparse._SubParsersAction)), None)
    names: dict[str, str] = {}
    for action in sub._actions if sub is not None else ():
        longs = [o for o in action.option_strings if o.startswith("--")]
        plain = [o for o in longs if not o.startswith("--no-")] or longs
        # a dest set by a --no- flag and a plain one (--no-skip-nonfinite, --skip-nonfinite):
        # the plain one, whichever was added first
        if plain and (action.dest not in names or names[action.dest].startswith("--no-")):
            names[action.dest] = plain[0]
    return names


def as_flags(message: str, names: dict[str, str]) -> str:
    """The Python spelling that the engine's and the configs' errors use (`device='cpu'`,
    `gpu_memory=1.0 KiB`, `raise gpu_memory`) as the flag a command-line user types
    (`--device cpu`, `--gpu-memory 1.0 KiB`, `raise --gpu-memory`)."""
    if not names:
        return message
    keys = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    value = r"(?:'([^']*)'|(\[[^\]]*\]|[^\s,;)]+))"

    def flag(m: re.Match) -> str:
        val = m.group(2) if m.group(2) is not None else m.group(3)
        if val.startswith("torch."):   # compute_dtype=torch.bfloat16: --compute-dtype bfloat16
            val = val[len("torch."):]
        return f"{names[m.group(1)]} {val}"
    message = re.sub(rf"(?<![\w.\-])({keys})={value}", flag, message)
    # a bare name ("raise gpu_memory"), only where it cannot be an English word
    under = "|".join(re.escape(k) for k in names if "_" in k)
    if under:
        message = re.sub(rf"(?<![\w.\-'])({under})(?![\w=('])",
                         lambda m: names[m.group(1)], message)
    return message


def _say(line: str, args=None) -> None:
    """One line on stderr; a rank of `--nproc N` hands it to the launcher, which prints
    each job's error once (not once per rank). Under plain torchrun an error every rank
    meets alike (the arguments', before the ranks join) is printed by each node's first
    rank, and any other with its rank in front."""
    from .parallel.launch import report_line, under_torchrun
    if under_torchrun():
        if report_line(line):
            return
        if getattr(args, "uniform_error", False):
            if int(os.environ.get("LOCAL_RANK", 0)) != 0:
                return
        else:
            line = f"[rank {os.environ['RANK']}] {line}"
    print(line, file=sys.stderr)


class _OneLineParser(argparse.ArgumentParser):
    """Usage mistakes as one line on stderr (exit 2), pointing at --help."""

    def error(self, message: str):
        if message.endswith("expected one argument"):
            # "--gpu-memory -1GiB": argparse takes a value starting with '-' for a flag
            flag = message.split()[1].rstrip(":").split("/")[0]
            message += (f" (give it a value; one that starts with '-' goes as "
                        f"{flag}=VALUE)")
        # a mistake every rank of a plain torchrun meets alike: its node's first rank says it
        _say(f"{self.prog}: error: {message} (see {self.prog} --help)",
             argparse.Namespace(uniform_error=True))
        self.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="outcore", description="Train models larger than "
                            "GPU memory, from host memory.")
    sub = parser.add_subparsers(dest="command", parser_class=_OneLineParser)
    _train_parser(sub)
    from . import plan_cli
    plan_cli.register(sub)
    for mod in ("gemm", "embed"):
        try:
            register = __import__(f"outcore.{mod}.cli", fromlist=["register"]).register
        except (ImportError, AttributeError):
            continue  # that capability is not built in this checkout
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        argv = ["train"]  # no arguments: the demo
    args = parser.parse_args(argv)
    args.argv = argv
    args.flag_names = _flag_names(parser, args)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()   # here, where a closed pipe is caught, not at the exit
        return rc
    except BrokenPipeError:
        # the reader went away (`outcore plan ... | head -1`): stop quietly, as `cat` does;
        # stdout on /dev/null so the exit's flush meets no closed pipe again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13   # the shell's code for SIGPIPE
    except OutcoreError as e:
        _say(f"outcore: error: {as_flags(str(e), args.flag_names)}", args)
        return 2
    except KeyboardInterrupt:
        _say("outcore: interrupted", args)
        return 130


if __name__ == "__main__":
    sys.exit(main())
