"""Starting the ranks: torchrun (one machine or many), or `outcore train --nproc N`.

    torchrun --nproc-per-node 2 -m outcore.cli train --model 3b ...        # one machine
    torchrun --nnodes 2 --node-rank K --nproc-per-node 8 \\
             --rdzv-backend c10d --rdzv-endpoint HOST0:29500 -m outcore.cli train ...
    outcore train --nproc 2 ...   # re-executes itself as 2 ranks (relaunch, below)

Each rank calls `init_distributed()`: NCCL when CUDA is there (rank -> cuda:LOCAL_RANK),
gloo otherwise, a 60 s collective timeout, and the heartbeat watchdog (watchdog.py).
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import OutcoreError
from .watchdog import Watchdog

_WATCHDOG: Watchdog | None = None


def use_distributed(flag: bool | None) -> bool:
    """distributed=True, or None with an initialised process group of more than one rank."""
    if flag is None:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return bool(flag)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(backend: str | None = None, timeout_s: float = 60.0,
                     heartbeat_s: float = 20.0) -> Watchdog | None:
    """Join the job torchrun (or a test) described in the environment; returns the watchdog.

    heartbeat_s: a rank silent that long is declared dead and every other rank exits.
    """
    global _WATCHDOG
    if not under_torchrun():
        raise OutcoreError("init_distributed() needs RANK, WORLD_SIZE, MASTER_ADDR and "
                           "MASTER_PORT: launch with torchrun or outcore train --nproc N")
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    if _WATCHDOG is None and dist.get_world_size() > 1:
        store = dist.PrefixStore("outcore/", dist.distributed_c10d._get_default_store())
        _WATCHDOG = Watchdog(store, dist.get_rank(), dist.get_world_size(),
                             timeout=heartbeat_s)
    return _WATCHDOG


def watchdog() -> Watchdog | None:
    return _WATCHDOG


def shutdown(barrier: bool = True) -> None:
    """Leave the job: stop the watchdog, destroy the process group (no-op outside one).

    barrier: wait for every rank first, so nobody's heartbeat reader sees us go (the end
    of a run); False on an error path, where a peer may never reach a barrier (or sits in
    another collective that a barrier would be matched against).
    """
    global _WATCHDOG
    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()   # collective: every rank leaves together
        if _WATCHDOG is not None:
            _WATCHDOG.stop()
            _WATCHDOG = None
        dist.destroy_process_group()


def local_device() -> str:
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


REPORTS = "OUTCORE_RANK_REPORTS"   # set by relaunch: the folder the ranks' error lines go to


def report_line(line: str) -> bool:
    """Under relaunch: hand this rank's one-line error to the launcher (which prints each
    distinct line once) instead of printing it; False when not under relaunch."""
    folder = os.environ.get(REPORTS)
    if not folder or not under_torchrun():
        return False
    try:
        Path(folder, f"rank-{int(os.environ['RANK'])}.txt").write_text(line)
    except OSError:
        return False
    return True


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def relaunch(nproc: int, argv: list[str], grace_s: float = 5.0) -> int:
    """Run `outcore <argv>` as nproc ranks on this machine; the job's exit code.

    This process hosts the rendezvous store (the ranks connect to it, like torchrun's
    agent store: if it dies, their watchdogs end them within seconds) and starts the ranks
    in their own session, so a terminal's Ctrl-C reaches them once, forwarded from here:
    the first SIGINT/SIGTERM (SIGHUP as SIGTERM) makes them checkpoint after the step and
    stop, the second stop at once, the third is SIGKILL. A rank that fails leaves the
    others `grace_s` to end on their own, then they are killed. Exit code: the first
    failing rank's (128 + N for a signal N), else 0. Each rank's one-line error comes here
    (report_line) and the first failing rank's is printed once.
    """
    if nproc < 1:
        raise OutcoreError(f"--nproc must be at least 1 (got {nproc})")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    reports = Path(tempfile.mkdtemp(prefix="outcore-ranks-"))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
               WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0",
               TORCHELASTIC_USE_AGENT_STORE="True", **{REPORTS: str(reports)})
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    got: list[int] = []
    procs: list[subprocess.Popen] = []

    def forward(signum, frame):
        got.append(signum)
        sig = signal.SIGKILL if len(got) >= 3 else \
            signal.SIGTERM if signum == signal.SIGHUP else signum
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    first: tuple[int, int] | None = None   # (rank, exit code) of the first rank that failed
    try:
        for r in range(nproc):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "outcore.cli", *argv], start_new_session=True,
                env=dict(env, RANK=str(r), LOCAL_RANK=str(r), ROLE_RANK=str(r))))
        deadline = None
        while True:
            codes = [p.poll() for p in procs]
            for r, c in enumerate(codes):
                if c not in (None, 0) and first is None:
                    first = (r, c)
                    deadline = time.monotonic() + grace_s
            if all(c is not None for c in codes):
                break
            if deadline is not None and not got and time.monotonic() > deadline:
                for p in procs:   # peers of a failed rank that neither exit nor fail
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s, h in old.items():
            signal.signal(s, h)
        lines = {int(f.stem.split("-")[1]): f.read_text() for f in reports.glob("rank-*.txt")}
        shutil.rmtree(reports, ignore_errors=True)
        del store
    if first is None:
        return 0
    rank, code = first
    if rank in lines:
        print(lines[rank], file=sys.stderr)
    elif code < 0 and got:   # ended by the signals forwarded from here
        print("outcore: interrupted", file=sys.stderr)
    elif code < 0:
        print(f"outcore: error: rank {rank} was killed by {_signal_name(code)}"
              f"{' (out of host memory?)' if code == -signal.SIGKILL else ''}",
              file=sys.stderr)
    elif lines:
        print(lines[min(lines)], file=sys.stderr)
    return 128 - code if code < 0 else code
