"""Bench for outcore.swap (issue 6): largest trainable batch and throughput under a GPU cap.

    cd <repo> && PYTHONPATH=src python3 bench/swap.py            # one H200: about 5 minutes
    cd <repo> && PYTHONPATH=src python3 bench/swap.py --smoke    # CPU, tiny CNN: seconds

torchvision ResNet-152 at 224x224, fp32, SGD with momentum, one process capped at --cap
GPU bytes (torch.cuda.set_per_process_memory_fraction):
  resnet152-maxbatch         max_batch of plain PyTorch and of outcore.swap(gpu_memory=cap),
                             doubling then bisection, one training step per probe; plus
                             plain PyTorch at outcore's batch (its out-of-memory, an error row)
  resnet152-throughput       images_per_s at a batch both fit (largest power of two <= the
                             plain max): pytorch, outcore, save_on_cpu (PyTorch's own
                             torch.autograd.graph.save_on_cpu(pin_memory=True))
  resnet152-throughput-edge  images_per_s at the plain max batch itself: pytorch, outcore
  wide_resnet101_2-*         the same for a wide ResNet, when the time budget allows
Writes bench/results/swap-<machine>.json (--smoke: /tmp/swap-smoke.json unless --out).
Every search and case is bounded by the --budget-s deadline; a failed case is an error row.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
import time

if "--alloc-conf" in sys.argv[:-1]:  # allocator settings must be in place before CUDA starts
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = sys.argv[sys.argv.index("--alloc-conf") + 1]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

from outcore import OutcoreError  # noqa: E402
from outcore.swap import HostStore, swap  # noqa: E402
from outcore.units import fmt_bytes, parse_bytes  # noqa: E402

GB = 1e9
START = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - START


# ---- models ----------------------------------------------------------------------------
def tiny_cnn(width: int) -> torch.nn.Module:
    """Smoke model: conv, BatchNorm, ReLU, pooling, linear (no torchvision needed)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True),
        nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
        nn.BatchNorm2d(2 * width), nn.ReLU(True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(2 * width, 10))


def build(name: str, smoke: bool) -> torch.nn.Module:
    if smoke:
        return tiny_cnn(8 if name == "resnet152" else 16)
    import torchvision  # on the GPU machine only
    return getattr(torchvision.models, name)(weights=None)


# ---- one training step, three systems --------------------------------------------------
def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower() \
        or "ALLOC_FAILED" in str(e)


class Runner:
    """Trains `model` one step at a time as `system`; counts simulated memory in --smoke."""

    def __init__(self, args, model, device):
        self.args, self.model, self.device = args, model, device
        self.cuda = device.type == "cuda"
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.store = HostStore(parse_bytes(args.slab), limit=args.host_limit,
                               granule=4096 if args.smoke else 64 * 1024)
        self.swap = None
        self.host_peak = 0
        self.last_ok: dict = {}

    def data(self, b: int):
        g = torch.Generator(device=self.device).manual_seed(b)
        x = torch.randn(b, 3, self.args.image, self.args.image, device=self.device, generator=g)
        return x, torch.randint(0, 10, (b,), device=self.device, generator=g)

    def open(self, system: str) -> None:
        if system == "outcore":
            self.swap = swap(self.model, gpu_memory=self.args.cap, store=self.store,
                             min_swap_bytes=self.args.min_swap, force_copy=not self.cuda,
                             prefetch_bytes=self.args.prefetch)

    def close(self) -> None:
        if self.swap is not None:
            self.swap.close()
            self.swap = None

    def step(self, system: str, x, y) -> None:
        ctx = contextlib.nullcontext()
        if system == "save_on_cpu":
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=self.cuda)
        elif system == "pytorch" and not self.cuda:
            ctx = SimulatedCap(self.args.cap)
        kept0 = self.swap.report().kept_bytes if self.swap and not self.cuda else 0
        with ctx:
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
        if self.swap is not None and not self.cuda:
            if self.swap.report().kept_bytes - kept0 > self.args.cap:
                raise torch.OutOfMemoryError("simulated: kept activations exceed the cap")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.cuda:
            torch.cuda.synchronize()  # host sync: a step is timed and probed whole

    def probe(self, system: str, b: int) -> str | None:
        """Train one step at batch b; None if it fits, else why not."""
        why, rep = None, None
        # Pinned bytes this probe used at most (sizes the next probe's host estimate).
        self.store.peak_in_use_bytes = self.store.in_use_bytes
        self.reset_peak()
        self.open(system)
        try:
            x, y = self.data(b)
            self.step(system, x, y)
            rep = self.swap.report() if self.swap is not None else None
        except OutcoreError as e:
            why = f"host memory: {e}"
        except RuntimeError as e:
            if not is_oom(e):
                raise
            why = "out of memory: " + error_text(e)
        finally:
            x = y = None
            self.close()
            self.cleanup()
        self.host_peak = self.store.peak_in_use_bytes
        if why is None:
            self.last_ok = {"peak_gpu_gb": self.peak_gb(), "peak_reserved_gb": self.reserved_gb()}
            if rep is not None:
                self.last_ok.update(gb_to_host=round(rep.bytes_to_host / GB, 2),
                                    gb_kept=round(rep.kept_bytes / GB, 2),
                                    host_peak_gb=round(self.host_peak / GB, 2),
                                    copy_hidden_fraction=round(rep.hidden_fraction, 3))
        return why

    def cleanup(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def peak_gb(self) -> float | None:
        return round(torch.cuda.max_memory_allocated() / GB, 2) if self.cuda else None

    def reserved_gb(self) -> float | None:
        """Peak bytes the allocator held: what the cap (memory fraction) limits."""
        return round(torch.cuda.max_memory_reserved() / GB, 2) if self.cuda else None

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()


class SimulatedCap(torch.autograd.graph.saved_tensors_hooks):
    """--smoke only: plain PyTorch 'runs out of memory' when its saved bytes exceed the cap."""

    def __init__(self, cap: int):
        self.cap, self.total, self.seen = cap, 0, set()
        super().__init__(self._pack, lambda t: t)

    def _pack(self, t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in self.seen and not isinstance(t, torch.nn.Parameter):
            self.seen.add(key)
            self.total += key[1]
            if self.total > self.cap:
                raise torch.OutOfMemoryError("simulated: saved activations exceed the cap")
        return t


# ---- cases -----------------------------------------------------------------------------
def search(run: Runner, system: str, start: int, limit: int, deadline: float, res: int,
           bar) -> dict:
    """Largest batch that trains one step: double from `start`, then bisect to `res`."""
    good, bad, why, probes, t0 = 0, None, None, 0, time.monotonic()
    at_good: dict = {}
    per_image_host = None

    def attempt(batch: int) -> str | None:
        """None when `batch` trains a step, else why not (an estimate skips the probe)."""
        nonlocal probes
        if per_image_host and run.store.limit and per_image_host * batch > run.store.limit:
            return "host memory (estimated from the last probe)"
        bar.set_postfix_str(f"{system} batch {batch}")
        probes += 1
        return run.probe(system, batch)

    b = start
    while bad is None and b <= limit and time.monotonic() < deadline:
        why_b = attempt(b)
        if why_b is None:
            good, at_good = b, run.last_ok
            per_image_host = run.host_peak / b or per_image_host
            b *= 2
        else:
            bad, why = b, why_b
    while bad is not None and bad - good > max(1, good // res) and time.monotonic() < deadline:
        mid = (good + bad) // 2
        why_m = attempt(mid)
        if why_m is None:
            good, at_good = mid, run.last_ok
        else:
            bad, why = mid, why_m
    capped = bad is None or bad - good > max(1, good // res)
    limited_by = ("time" if time.monotonic() >= deadline and capped else
                  "search limit" if bad is None else
                  "host memory" if why.startswith("host memory") else "gpu memory")
    return {"max_batch": good, "first_failing_batch": bad, "failure": why, "probes": probes,
            "search_s": round(time.monotonic() - t0, 1), "search_capped": capped,
            "limited_by": limited_by, **at_good}


def measure(run: Runner, system: str, b: int, warmup: int, steps: int, deadline: float) -> dict:
    """Median step time over `steps` steps after `warmup` (one Swap for all of them)."""
    run.open(system)
    try:
        x, y = run.data(b)
        for _ in range(warmup):
            run.step(system, x, y)
        run.reset_peak()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            run.step(system, x, y)
            times.append(time.perf_counter() - t0)
            if time.monotonic() > deadline and len(times) >= 2:
                break
        med = statistics.median(times)
        row = {"batch": b, "images_per_s": round(b / med, 1), "step_s": round(med, 4),
               "steps": len(times), "peak_gpu_gb": run.peak_gb(),
               "peak_reserved_gb": run.reserved_gb()}
        if run.swap is not None:
            rep = run.swap.report()
            n = rep.forwards + rep.unhooked_forwards
            row.update(unhooked_forwards=rep.unhooked_forwards,
                       gb_to_host_per_step=round(rep.bytes_to_host / n / GB, 3),
                       gb_to_device_per_step=round(rep.bytes_to_device / n / GB, 3),
                       copy_hidden_fraction=round(rep.hidden_fraction, 3))
        return row
    finally:
        x = y = None
        run.close()
        run.cleanup()


def error_text(e: BaseException) -> str:
    lines = str(e).strip().splitlines() or [""]
    return f"{type(e).__name__}: {lines[0][:200]}"


def pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def bench_model(name: str, args, device, rows: list, deadline: float, bar, full: bool) -> None:
    model = build(name, args.smoke).to(device)
    run = Runner(args, model, device)
    case = lambda kind: f"{name}-{kind}"  # noqa: E731
    try:
        run.probe("pytorch", 2)  # warm up CUDA/cuDNN and allocate the momentum buffers
        share = (deadline - time.monotonic())
        plain = search(run, "pytorch", 1 if args.smoke else 16, args.max_batch,
                       time.monotonic() + 0.15 * share, 10**9, bar)
        rows.append({"system": "pytorch", "case": case("maxbatch"), **plain})
        bar.update()
        pmax = plain["max_batch"]
        if pmax < 1:
            raise RuntimeError("plain PyTorch cannot train even one image under the cap")
        tb = pow2_floor(pmax)
        systems = ["pytorch", "outcore"] + (["save_on_cpu"] if full else [])
        tput = {}
        for system in systems:
            left = deadline - time.monotonic()
            steps = 3 if system == "save_on_cpu" else args.steps
            try:
                tput[system] = {"system": system, "case": case("throughput"), **measure(
                    run, system, tb, 1 if system == "save_on_cpu" else 2, steps,
                    time.monotonic() + 0.12 * left)}
                rows.append(tput[system])
            except Exception as e:  # one system failing must not lose the others
                rows.append({"system": system, "case": case("throughput"), "batch": tb,
                             "error": error_text(e)})
                run.close()
                run.cleanup()
        if "images_per_s" in tput.get("outcore", {}):
            o = tput["outcore"]["images_per_s"]
            for peer in ("pytorch", "save_on_cpu"):
                if "images_per_s" in tput.get(peer, {}):
                    tput["outcore"][f"vs_{peer}"] = round(o / tput[peer]["images_per_s"], 3)
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()  # give save_on_cpu's pinned memory back
        bar.update()
        if tb != pmax and full:
            for system in ("pytorch", "outcore"):
                row = {"system": system, "case": case("throughput-edge")}
                try:
                    row.update(measure(run, system, pmax, 2, args.steps, time.monotonic() + 10))
                except Exception as e:  # an error row, and the bench goes on
                    row.update(batch=pmax, error=error_text(e))
                    run.close()
                    run.cleanup()
                rows.append(row)
        bar.update()
        left = deadline - time.monotonic()
        res = 16 if not args.smoke else 4
        oc = search(run, "outcore", pmax, args.max_factor * pmax,
                    time.monotonic() + 0.85 * left, res, bar)
        oc["vs_pytorch"] = round(oc["max_batch"] / pmax, 2)
        oc["host_pinned_gb"] = round(run.store.reserved_bytes / GB, 2)
        rows.append({"system": "outcore", "case": case("maxbatch"), **oc})
        bar.update()
        if oc["max_batch"] > pmax:
            why = run.probe("pytorch", oc["max_batch"])
            row = {"system": "pytorch", "case": case("maxbatch"), "batch": oc["max_batch"]}
            rows.append({**row, "error": why} if why else {**row, "note": "trained (no OOM)"})
        bar.update()
    finally:
        run.close()
        run.store.release()
        del model, run
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


# ---- main ------------------------------------------------------------------------------
def machine_name(device) -> str:
    if device.type != "cuda":
        return "cpu-smoke"
    gpu = torch.cuda.get_device_name(device)
    return "nvidia-h200" if "H200" in gpu else "-".join(gpu.lower().split())


def host_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info.get("MemAvailable", info["MemTotal"])
    except (OSError, KeyError):
        return 64 * 1024**3


def commit() -> str:
    import common
    return common.git_commit()


def table(rows: list) -> str:
    lines = [f"{'case':32} {'system':12} {'max_batch':>9} {'batch':>6} {'img/s':>9}  note"]
    for r in rows:
        note = r.get("error") or r.get("limited_by") or (
            f"vs pytorch {r['vs_pytorch']}" if "vs_pytorch" in r else "")
        lines.append(f"{r['case']:32} {r['system']:12} {str(r.get('max_batch', '')):>9} "
                     f"{str(r.get('batch', '')):>6} {str(r.get('images_per_s', '')):>9}  "
                     f"{str(note)[:60]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Takes about 5 "
                                 "minutes on one H200 (bounded by --budget-s); --smoke: seconds "
                                 "on the CPU.")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny CNN, simulated cap")
    ap.add_argument("--cap", default="16GiB", help="GPU memory cap (default 16GiB)")
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--budget-s", type=float, default=290.0, help="time bound (seconds)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per throughput row")
    ap.add_argument("--max-batch", type=int, default=4096, help="plain search ceiling")
    ap.add_argument("--max-factor", type=int, default=8, help="outcore search ceiling x plain")
    ap.add_argument("--host-fraction", type=float, default=0.7,
                    help="pinned host memory allowed for swapping, share of MemAvailable")
    ap.add_argument("--min-swap", default="1MiB", help="outcore min_swap_bytes")
    ap.add_argument("--prefetch", default=None, help="outcore prefetch_bytes (default: auto)")
    ap.add_argument("--slab", default="1GiB", help="pinned host slab size")
    ap.add_argument("--no-wide", action="store_true", help="skip wide_resnet101_2")
    ap.add_argument("--alloc-conf", default=None,
                    help="PYTORCH_CUDA_ALLOC_CONF for every system (default: torch's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.smoke:
        args.cap, args.image, args.slab, args.budget_s = "256KiB", 16, "256KiB", 60.0
        args.steps, args.max_batch, args.min_swap, args.prefetch = 3, 64, "1KiB", "16KiB"
        args.host_limit = 1024**2  # small: the outcore search ends at the host limit
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            sys.exit("bench/swap.py needs a GPU; run with --smoke on the CPU")
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, parse_bytes(args.cap) / total))
        args.host_limit = int(args.host_fraction * host_available())
    args.cap = parse_bytes(args.cap)
    deadline = START + args.budget_s
    machine = machine_name(device)
    import common
    out = common.out_path(args.out, "/tmp/swap-smoke.json" if args.smoke else
                          os.path.join(os.path.dirname(__file__), "results",
                                       f"swap-{machine.removeprefix('nvidia-')}.json"))
    rows: list = []
    models = [("resnet152", True)] + ([] if args.no_wide else [("wide_resnet101_2", False)])
    bar = tqdm(total=5 * len(models), desc="swap bench", unit="stage", dynamic_ncols=True)
    for i, (name, full) in enumerate(models):
        left = deadline - time.monotonic()
        if i > 0 and left < 0.25 * args.budget_s:
            rows.append({"system": "outcore", "case": f"{name}-maxbatch",
                         "error": f"skipped: {left:.0f} s of the time budget left"})
            continue
        until = deadline if i == len(models) - 1 else time.monotonic() + (0.72 if full else 1) * left
        try:
            bench_model(name, args, device, rows, until, bar, full)
        except Exception as e:  # a whole model failing becomes an error row
            rows.append({"system": "outcore", "case": f"{name}-maxbatch",
                         "error": error_text(e)})
    bar.close()
    for r in rows:
        r.update(cap_gib=round(args.cap / 2**30, 2), image=args.image)
    result = {
        "benchmark": "swap", "command": "python3 bench/swap.py " + " ".join(sys.argv[1:]),
        "commit": commit(), "machine": machine,
        "gpus": [torch.cuda.get_device_name(device)] if device.type == "cuda" else [],
        "torch": torch.__version__,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),   # None: torch's default
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "runs": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {out} in {elapsed():.0f} s (cap {fmt_bytes(args.cap)})")
    print(table(rows))


if __name__ == "__main__":
    main()
