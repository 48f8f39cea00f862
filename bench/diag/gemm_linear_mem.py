"""Which allocations make gemm.Linear's reserved peak pass its budget (GPU diagnosis)."""
import torch
from outcore.gemm import Linear
torch.manual_seed(0)
budget = 256 << 20
layer = Linear(4096, 4096, gpu_memory=budget, devices=0)
x = torch.randn(3000, 4096, requires_grad=True)
torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=100000)
for i in range(2):
    layer(x).square().mean().backward()
    torch.cuda.synchronize()
    print("pass", i, "reserved peak MB", torch.cuda.max_memory_reserved() >> 20,
          "allocated peak MB", torch.cuda.max_memory_allocated() >> 20, flush=True)
snap = torch.cuda.memory._snapshot()
for seg in snap["segments"]:
    print("segment", seg["total_size"] >> 20, "MB", "stream", seg["stream"],
          [(b["size"] >> 20, b["state"]) for b in seg["blocks"]][:6])
ev = [e for e in snap["device_traces"][0] if e["action"] in ("alloc", "segment_alloc")]
for e in ev[:40]:
    fr = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in e["frames"]
          if "outcore" in f["filename"]][:3]
    print(e["action"], e["size"] >> 20, "MB", e.get("stream"), fr)
