"""Start N worker processes as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).with_name("worker_parallel.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(cfg: dict, n: int, timeout: float = 90.0, worker: Path = WORKER):
    """-> ([return codes], [stderr texts], seconds until the last rank exited)."""
    port = free_port()
    procs = []
    t0 = time.monotonic()
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(worker), json.dumps(cfg)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            err = (err or "") + "\n[test: killed after timeout]"
        errs.append(err or "")
    return [p.returncode for p in procs], errs, time.monotonic() - t0
