#!/usr/bin/env python3
"""An MLP whose first layer is larger than the GPU budget trains (issue 4, item 3).

    PYTHONPATH=src python3 bench/gemm_linear.py            # 65536 x 65536 fp32 (16 GiB)
                                                          # against 8 GiB; ~1 min on an H200
    PYTHONPATH=src python3 bench/gemm_linear.py --smoke    # CPU, tiny, seconds
    PYTHONPATH=src python3 bench/gemm_linear.py --compute strassen   # the layer's arithmetic

Model: outcore.gemm.Linear(F, F) (weight on the host) -> ReLU -> torch.nn.Linear(F, 10)
on the host; SGD on one fixed batch of T tokens. Every product of the big layer (forward
y = x W^T, backward dx = dy W and dW = dy^T x) runs through outcore.matmul under
`--gpu-memory`. Before training, the first loss is also computed in plain PyTorch with
everything in GPU memory (fp32, no tf32; on the CPU in the smoke run) and compared. Writes
bench/results/gemm-linear-<machine>.json: per-step wall time and loss, the big layer's
TFLOP/s (3 products of 2 T F^2 each per step), the peak GPU memory against the budget,
the host's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from outcore.gemm import Linear  # noqa: E402
from outcore.memory.pinned import host_peak_rss_bytes  # noqa: E402
from outcore.units import parse_bytes  # noqa: E402


def reference_loss(model: nn.Sequential, x: torch.Tensor, target: torch.Tensor,
                   dev: torch.device) -> float:
    """The same forward in plain PyTorch with every tensor on `dev` (fp32, no tf32)."""
    big, head = model[0], model[2]
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            h = torch.relu(x.to(dev) @ big.weight.to(dev).T + big.bias.to(dev))
            out = h @ head.weight.to(dev).T + head.bias.to(dev)
            loss = nn.functional.cross_entropy(out, target.to(dev)).item()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return loss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", type=int, default=65536)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--gpu-memory", default="8GiB")
    ap.add_argument("--compute", default=None, help="the layer's arithmetic (outcore.matmul's "
                    "compute=: fp32 by default for fp32 data, or tf32x3, strassen, ...)")
    # 0.05 made the loss rise on the H200 (2.33 -> 28.1 in 4 steps,
    # gemm-linear-h200.json); 0.002 made it fall (gemm-linear-h200-lr002.json)
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--smoke", action="store_true", help="CPU, 512 features (2048 under "
                    "strassen), seconds")
    ap.add_argument("--out", help="results name (default gemm-linear-<machine>)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    # the smoke run's layer 4x its budget; strassen's quadrants (strassen.MIN_HALF) need more
    smoke = (2048, "4MiB") if args.compute == "strassen" else (512, "256KiB")
    F, T = (smoke[0], 64) if args.smoke else (args.features, args.tokens)
    budget = smoke[1] if args.smoke else args.gpu_memory
    devices = None if cuda else "cpu"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    big = Linear(F, F, gpu_memory=budget, devices=devices, compute=args.compute)
    model = nn.Sequential(big, nn.ReLU(), nn.Linear(F, 10))
    x, target = torch.randn(T, F), torch.randint(0, 10, (T,))
    setup_s = time.perf_counter() - t0
    weight_bytes = big.weight.numel() * big.weight.element_size()
    print(f"layer {F} x {F} fp32 (compute {args.compute or 'fp32'}): "
          f"{weight_bytes / 2**30:.1f} GiB on the host, budget {budget}"
          f" (built and pinned in {setup_s:.0f} s)", flush=True)
    ref = reference_loss(model, x, target, torch.device("cuda" if cuda else "cpu", 0))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses, times = [], []
    for step in range(args.steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
        print(f"  step {step}: {times[-1]:.2f} s loss {losses[-1]:.4f}", flush=True)
    flops = 3 * 2.0 * T * F * F
    med = statistics.median(times[1:] if len(times) > 1 else times)
    row = {"case": f"mlp-{F}", "system": "outcore", "compute": args.compute or "fp32",
           "features": F, "tokens": T,
           "weight_gib": weight_bytes / 2**30, "gpu_memory": budget,
           "gpu_memory_bytes": parse_bytes(budget, "gpu_memory"),
           "losses": losses, "step_s": times, "median_step_s": med,
           "layer_tflops": flops / med / 1e12, "loss_falls": losses[-1] < losses[0],
           "reference_loss": ref,
           "first_loss_rel_error": abs(losses[0] - ref) / abs(ref),
           "peak_gpu_gb": torch.cuda.max_memory_reserved() / 1e9 if cuda else None,
           "peak_gpu_allocated_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
           "host_peak_gb": host_peak_rss_bytes() / 1e9, "setup_s": setup_s}
    row["within_budget"] = (row["peak_gpu_gb"] * 1e9 <= row["gpu_memory_bytes"]) if cuda \
        else None
    doc = common.header("gemm-linear")
    doc["runs"].append(row)
    doc["notes"] = ["step_s: wall time of one SGD step (forward, backward, update) with x and "
                    "the weight in host memory; layer_tflops counts the big layer's three "
                    "products over the median step after the first",
                    "reference_loss: the first forward in plain PyTorch with everything on "
                    "GPU 0 in fp32 (no tf32; the CPU in a smoke run)"]
    name = args.out or ("gemm-linear-cpu-smoke" if not cuda else
                        f"gemm-linear-{common.machine_name()}")
    path = common.write(doc, name)
    print(common.table([row], ["case", "weight_gib", "gpu_memory", "median_step_s",
                               "layer_tflops", "peak_gpu_gb", "loss_falls",
                               "first_loss_rel_error"]))
    print(f"wrote {path}")
    ok = row["loss_falls"] and row["within_budget"] is not False and \
        row["first_loss_rel_error"] < 1e-4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
