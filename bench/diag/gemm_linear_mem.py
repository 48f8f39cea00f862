"""Which allocations make gemm.Linear's reserved peak pass its budget (GPU diagnosis).

    PYTHONPATH=src python3 bench/diag/gemm_linear_mem.py                     # 4096, 256 MiB
    PYTHONPATH=src python3 bench/diag/gemm_linear_mem.py --features 65536 --tokens 4096 \\
        --gpu-memory 8GiB                                                    # gemm_linear's

Runs forward and backward of one Linear twice with the allocator's history on, then
prints the peaks, the segments left, and every allocation of at least --min-mib with its
stream and the outcore frames that made it. Session 9 ran an earlier form of it with the
defaults (226 MB reserved: within the budget in a fresh process).
"""

import argparse

import torch

from outcore.gemm import Linear
from outcore.units import parse_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--gpu-memory", default="256MiB")
    ap.add_argument("--min-mib", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    budget = parse_bytes(args.gpu_memory, "gpu_memory")
    layer = Linear(args.features, args.features, gpu_memory=budget, devices=0)
    x = torch.randn(args.tokens, args.features, requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    for i in range(2):
        layer(x).square().mean().backward()
        torch.cuda.synchronize()
        print(f"pass {i}: reserved peak {torch.cuda.max_memory_reserved() >> 20} MiB, "
              f"allocated peak {torch.cuda.max_memory_allocated() >> 20} MiB, "
              f"budget {budget >> 20} MiB", flush=True)
    snap = torch.cuda.memory._snapshot()
    for seg in snap["segments"]:
        print(f"segment {seg['total_size'] >> 20} MiB stream {seg['stream']}:",
              [(b["size"] >> 20, b["state"]) for b in seg["blocks"]][:6])
    for e in snap["device_traces"][0]:
        if e["action"] not in ("alloc", "segment_alloc", "free_completed", "segment_free"):
            continue
        if e["size"] < args.min_mib << 20:
            continue
        frames = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}"
                  for f in e["frames"] if "outcore" in f["filename"]][:3]
        print(f"{e['action']:15s} {e['size'] >> 20:6d} MiB stream {e.get('stream')} {frames}")


if __name__ == "__main__":
    main()
