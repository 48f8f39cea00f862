"""Data-parallel streaming on N GPUs: scaling, unequal GPUs, largest model.

    cd <repo> && PYTHONPATH=src python3 bench/parallel.py          # ~6-8 min on 2 x H200
    PYTHONPATH=src python3 bench/parallel.py --smoke                # CPU, gloo, 2 ranks, secs
    PYTHONPATH=src python3 bench/parallel.py --smoke --gpus 3       # CPU, gloo, 3 ranks

Writes bench/results/parallel-<machine>.json (DESIGN.md's format; parallel-h200xN.json on
N GPUs: every visible one, or --gpus N). Each case is one job of 1 or N ranks started as
torchrun would (RANK/WORLD_SIZE/MASTER_*), with a wall-clock cap; a failed or timed-out
case becomes a row with "error". Cases (N = 2 gives the names 3b-2gpu, largest-2gpu):
  3b-1gpu, 3b-Ngpu           16k tokens per GPU per step (seq 2048): tokens_per_s
  3b-slowed-equal/-measured  the last rank's GPU shares its time with another process
                             running bf16 matmuls nonstop (common.Hog; GPU settings never
                             touched)
  largest-1gpu, largest-Ngpu the most layers of the 7b shape whose host need fits 85% of
                             host RAM (largest_layers). Every model is built on the meta
                             device: each rank makes real only its own shard of the state
                             (stream/materialize.py), so N ranks do not build N models.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

from common import Hog, header, median, table, write  # noqa: E402


def _train(engine, model, case: dict, n: int, cuda: bool) -> tuple[list, list]:
    """case['steps'] steps on random tokens: (step times, losses)."""
    vocab = model.cfg.vocab if hasattr(model, "cfg") else 256
    gen = torch.Generator().manual_seed(1)
    rows = case["rows_per_gpu"] * n
    times, losses = [], []
    for _ in range(case["steps"]):
        x = torch.randint(0, vocab, (rows, case["seq"]), generator=gen)
        t = time.perf_counter()
        losses.append(engine.train_step({"input_ids": x, "labels": x}))
        if cuda:
            torch.cuda.synchronize()  # host sync: time whole steps
        times.append(time.perf_counter() - t)
    return times, losses


def worker(case: dict) -> None:
    """One rank: build the model, train case['steps'] steps, rank 0 writes the row."""
    import outcore
    from outcore.memory import host_peak_rss_bytes
    from outcore.models import decoder
    from outcore.parallel import init_distributed, shutdown
    n = case["nproc"]
    rank = int(os.environ.get("RANK", 0))
    if n > 1:
        init_distributed()
    cuda = torch.cuda.is_available()
    device = f"cuda:{rank}" if cuda else "cpu"
    torch.manual_seed(0)
    model = decoder(case["size"], lazy=True, max_seq=case["seq"],
                    **({"layers": case["layers"]} if "layers" in case else {}))
    # No host copies (one rank only could take them): the largest rows are sized without
    # them, and the rows of every session so far had none.
    kw = dict(device=device, micro_batch_size=case["micro"], max_grad_norm=1.0,
              gpu_memory=case.get("gpu_memory"), host_weight_copy=False)
    if n > 1:
        kw.update(distributed=True, shares=case.get("shares"), measure_every=5)
    # The slowed rank's GPU runs another process's matmuls all along: it takes part of the
    # GPU's time, and being a process apart, this rank's device syncs never wait for it.
    # Started before the engine, which then plans around the memory the hog holds.
    slowed = case.get("slow_rank") == rank and cuda
    with Hog(torch.device(device), smoke=False) if slowed else contextlib.nullcontext():
        engine = outcore.Engine(model, optimizer=outcore.AdamW(lr=1e-4), **kw)
        times, losses = _train(engine, model, case, n, cuda)
    rows = case["rows_per_gpu"] * n
    steady = times[case["warmup"]:] or times
    step = median(steady)
    row = {"tokens_per_s": rows * case["seq"] / step, "step_s": step,
           "params": engine.num_params, "host_bytes_per_param":
           engine.host_bytes_per_param() * n,  # the machine's total over its ranks
           "host_bytes_per_param_per_rank": engine.host_bytes_per_param(),
           "peak_gpu_gb": engine.stats.peak_device_bytes / 1e9,
           "first_loss": losses[0], "last_loss": losses[-1], "steps": len(times),
           "tokens_per_step": rows * case["seq"]}
    # Each rank's peak resident memory (pinned state, pools, libraries): what the machine
    # held, against the engine's own count above (host_bytes_per_param).
    rss = [host_peak_rss_bytes()]
    if n > 1:
        row["shares"] = engine.meter.shares
        row["rows_last_step"] = engine.stats.history[-1]["rows"]
        rss = [None] * n
        torch.distributed.all_gather_object(rss, host_peak_rss_bytes())
    row["host_peak_rss_gb_per_rank"] = [r / 1e9 for r in rss]
    row["host_rss_bytes_per_param"] = sum(rss) / engine.num_params
    engine.close()
    if rank == 0:
        Path(case["out"]).write_text(json.dumps(row))
    if n > 1:
        shutdown()


def run_case(case: dict, limit_s: float) -> dict:
    """Start case['nproc'] ranks of this script; the row (or an error row)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(tempfile.mkdtemp()) / "row.json"
    case = dict(case, out=str(out))
    procs = []
    for r in range(case["nproc"]):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(case["nproc"]),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if case.get("cpu"):   # --smoke: CPU ranks on gloo even where GPUs are visible
            env["CUDA_VISIBLE_DEVICES"] = ""
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(case)],
                                      env=env, stderr=subprocess.PIPE, text=True))
    t0 = time.monotonic()
    err = ""
    for p in procs:
        try:
            _, e = p.communicate(timeout=max(1, limit_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            _, e = p.communicate()
            e = (e or "") + f"\ntimed out after {limit_s:.0f} s"
        if p.returncode and not err:   # the first failing rank's last stderr line
            err = (e or "").strip().splitlines()[-1] if (e or "").strip() else \
                f"rank exited {p.returncode}"
    base = {"system": "outcore", "case": case["name"], "gpus_used": case["nproc"]}
    if out.is_file() and not err:
        return {**base, **json.loads(out.read_text())}
    if out.is_file() and procs[0].returncode == 0 and "timed out" not in err:
        # rank 0 measured every step and wrote the row; another rank failed while exiting
        return {**base, **json.loads(out.read_text()), "exit_error": err[-300:]}
    return {**base, "error": err[-300:] or "no result"}


# Host bytes of one process per parameter at the largest single-GPU row (bench/stream.py's
# HOST_BYTES_PER_PARAM: 12 of state, the rest pinned pools and libraries), and what each
# further rank adds: its checkpoint pool (16k tokens x 4096 x 2 B per layer), its gradient
# staging and its CUDA and torch libraries.
HOST_BYTES_PER_PARAM = 15.5
RANK_BYTES_PER_LAYER = 16384 * 4096 * 2
RANK_BYTES = 10e9


def largest_layers(nproc: int, host_bytes: int) -> int:
    """Layers of the 7b shape whose host need (above) fits 85% of host RAM on nproc ranks."""
    from outcore.models import SIZES
    cfg = SIZES["7b"]
    ends = 2 * cfg.vocab * cfg.dim
    per_layer = (cfg.num_params() - ends) / cfg.layers
    room = 0.85 * host_bytes - HOST_BYTES_PER_PARAM * ends - (nproc - 1) * RANK_BYTES
    return max(1, int(room // (HOST_BYTES_PER_PARAM * per_layer
                               + (nproc - 1) * RANK_BYTES_PER_LAYER)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] + " (~6-8 min on "
                                 "2 x H200; --smoke: seconds on the CPU)")
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, 2 ranks, tiny sizes")
    ap.add_argument("--gpus", type=int, help="ranks of the multi-GPU cases (default: every "
                    "visible GPU; 2 with --smoke)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--case-limit", type=float, default=150.0, help="seconds per case")
    ap.add_argument("--cases", help="comma list of case names to run (default: all six)")
    ap.add_argument("--out", help="results name under bench/results (default "
                    "parallel-h200xN; with --cases give another, so a partial run does not "
                    "replace a whole one)")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    smoke = args.smoke or not torch.cuda.is_available()
    visible = 0 if smoke else torch.cuda.device_count()
    N = args.gpus or (2 if smoke else visible)
    if N < 2 or (not smoke and N > visible):
        sys.exit(f"bench/parallel.py: --gpus {N} needs 2..{max(visible, 2)} "
                 f"({visible} GPUs visible; --smoke runs any number of CPU ranks)")
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    size, seq, rpg, micro = ("tiny", 64, 2, 1) if smoke else ("3b", 2048, 8, 2)
    steps, warm = (3, 1) if smoke else (8, 3)
    c = dict(size=size, seq=seq, rows_per_gpu=rpg, micro=micro, steps=steps, warmup=warm,
             cpu=smoke)
    cases = [dict(c, name="3b-1gpu", nproc=1), dict(c, name=f"3b-{N}gpu", nproc=N),
             dict(c, name="3b-slowed-equal", nproc=N, slow_rank=N - 1),
             dict(c, name="3b-slowed-measured", nproc=N, slow_rank=N - 1, shares="measured",
                  steps=steps + (2 if smoke else 6))]
    for n in (1, N):
        big = {"size": "small"} if smoke else \
            {"size": "7b", "layers": largest_layers(n, host)}
        cases.append(dict(c, name=f"largest-{n}gpu", nproc=n, **big,
                          rows_per_gpu=rpg, steps=3 if not smoke else 2, warmup=1))
    if args.cases:
        want = args.cases.split(",")
        unknown = sorted(set(want) - {c["name"] for c in cases})
        if unknown:
            sys.exit(f"bench/parallel.py: unknown case(s) {', '.join(unknown)}: choose from "
                     + ", ".join(c["name"] for c in cases))
        cases = [c for c in cases if c["name"] in want]
    doc = header("parallel")
    doc["cases_run"] = [c["name"] for c in cases]
    for case in cases:
        t = time.monotonic()
        row = run_case(case, 60.0 if smoke else args.case_limit)
        row["size"] = case["size"] + (f" x {case['layers']} layers" if "layers" in case
                                      else "")
        row["wall_s"] = time.monotonic() - t
        doc["runs"].append(row)
        print(f"{case['name']}: {'error: ' + row['error'] if 'error' in row else 'ok'} "
              f"({row['wall_s']:.0f} s)", flush=True)
    by = {r["case"]: r for r in doc["runs"]}

    def ratio(a, b, key="tokens_per_s"):
        x, y = by.get(a, {}).get(key), by.get(b, {}).get(key)
        return x / y if x and y else None
    # targets: issue 5 (two GPUs), issue 9 (four and eight)
    scaling = {2: 1.9, 4: 3.7, 8: 7.2}.get(N)
    doc["summary"] = {f"{N}gpu_over_1gpu": ratio(f"3b-{N}gpu", "3b-1gpu"),
                      "measured_over_equal": ratio("3b-slowed-measured", "3b-slowed-equal"),
                      f"largest_params_{N}gpu_over_1gpu":
                          ratio(f"largest-{N}gpu", "largest-1gpu", "params"),
                      "targets": {f"{N}gpu_over_1gpu": scaling, "measured_over_equal": 1.3,
                                  f"largest_params_{N}gpu_over_1gpu":
                                      1.8 if N == 2 else None}}
    name = args.out or ("parallel-cpu-smoke" if smoke else f"parallel-h200x{N}")
    path = write(doc, name)
    print(f"wrote {path}\nsummary: {json.dumps(doc['summary'])}")
    print(table(doc["runs"], ["case", "size", "params", "tokens_per_s", "host_bytes_per_param",
                              "host_rss_bytes_per_param",
                              "peak_gpu_gb", "shares", "error"]))


if __name__ == "__main__":
    main()
