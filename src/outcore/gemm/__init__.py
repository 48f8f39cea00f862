"""Out-of-core multi-device matrix multiply on host-resident matrices, and a Linear layer
whose weight is larger than the GPU budget, trained through it.

    outcore.matmul(A, B, out=None, transa=False, transb=False, alpha=1.0, beta=0.0,
                   devices=None, gpu_memory=None, tile=None, compute=None)
    outcore.gemm.Linear(65536, 65536, gpu_memory="8GiB")
"""

from .linear import Linear
from .matmul import matmul
from .plan import make_plan
from .planned import GemmPlan
from .stats import GemmStats

__all__ = ["matmul", "Linear", "GemmPlan", "GemmStats", "make_plan"]
