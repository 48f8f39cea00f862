"""outcore: train neural networks larger than one GPU's memory.

Weights, gradients and optimizer state live in host memory; the GPU is fed what the next
piece of work needs while the copies for the piece after it run underneath.
"""

from .embed import EmbeddingTrainer
from .errors import OutcoreError
from .gemm import matmul
from .stream import AdamW, Engine
from .swap import swap

__version__ = "0.1.0"
__all__ = ["Engine", "AdamW", "matmul", "EmbeddingTrainer", "OutcoreError", "swap", "__version__"]
