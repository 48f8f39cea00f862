"""The first fp32 product of a fresh process, by the CLI and by matmul. (GPU)

    PYTHONPATH=src python3 bench/diag/fresh_fp32.py      # about 2 min on one H200

Session 27: bench/diag/host_setup.py, whose first product (fp32-16384 on pinned A, B and
C) is the first CUDA work of its process, stopped at the first copy out with "CUDA error:
invalid argument" (host-setup-h200-s27-failed*.log); bench/gemm.py and tile_ab.py, whose
fp32 products follow other GPU work, ran them. A user's `outcore gemm` is such a first
product. This runs each variant in a process of its own (CLI; cuBLASLt's configured fp32
kernel off, OUTCORE_GEMM_LT=0; CUDA_LAUNCH_BLOCKING=1; a smaller product; matmul alone;
matmul after one torch.mm) and writes each one's exit code and last lines to
bench/results/fresh-fp32-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import common  # noqa: E402

CLI = [sys.executable, "-m", "outcore.cli", "gemm", "--dtype", "float32", "--check", "16"]
PROBE = """
import torch, outcore
from outcore.memory import pin_
n = {n}
if {warm}:
    torch.mm(torch.ones(64, 64, device="cuda"), torch.ones(64, 64, device="cuda"))
A, B, C = (pin_(torch.empty(n, n)) for _ in range(3))
A.normal_(); B.normal_()
out, st = outcore.matmul(A, B, C, return_stats=True)
ref = A[:4].double() @ B.double()
print("max error", float((out[:4].double() - ref).abs().max()), st.plan)
"""
BIG = ["--m", "16384", "--n", "16384", "--k", "16384"]
VARIANTS = [
    ("cli-16384", CLI + BIG, {}),
    ("cli-16384-lt-off", CLI + BIG, {"OUTCORE_GEMM_LT": "0"}),
    ("cli-16384-blocking", CLI + BIG, {"CUDA_LAUNCH_BLOCKING": "1"}),
    ("cli-4096", CLI + ["--m", "4096", "--n", "4096", "--k", "4096"], {}),
    ("matmul-16384", [sys.executable, "-c", PROBE.format(n=16384, warm=False)], {}),
    ("matmul-16384-after-mm", [sys.executable, "-c", PROBE.format(n=16384, warm=True)], {}),
    ("matmul-16384-lt-off", [sys.executable, "-c", PROBE.format(n=16384, warm=False)],
     {"OUTCORE_GEMM_LT": "0"}),
]


def main() -> int:
    doc = common.header("fresh-fp32")
    doc["runs"] = []
    for name, cmd, env in VARIANTS:
        try:
            p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                               timeout=120)
            rc, text = p.returncode, (p.stdout + p.stderr)
        except subprocess.TimeoutExpired:
            rc, text = "timeout", ""
        tail = [ln for ln in text.strip().splitlines() if ln.strip()][-6:]
        doc["runs"].append({"variant": name, "rc": rc, "env": env, "tail": tail})
        print(f"== {name} (rc {rc})\n" + "\n".join(tail), flush=True)
    common.write(doc, f"fresh-fp32-{common.machine_name()}")
    print(common.table([{"variant": r["variant"], "rc": r["rc"],
                         "last": (r["tail"] or [""])[-1][:90]} for r in doc["runs"]],
                       ["variant", "rc", "last"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
