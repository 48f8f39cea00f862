"""outcore.embed: embedding tables larger than GPU memory, and node embeddings of graphs of
billions of edges (PyTorch-BigGraph's buckets, GraphVite's GPU training, the CPU walks of
"A Distributed Multi-GPU System for Large-Scale Node Embedding").

- `EmbeddingTable`: host (RAM or memory-mapped) table cut into P partitions, optimizer
  state beside the rows.
- `EmbeddingTrainer` / `EmbedConfig`: train on an edge list (LINE edges, DeepWalk or
  node2vec walks) across devices, one process per GPU.
- `read_edges`, `write_edges`: fast edge-list text and .npy input.
- `evaluate_link_prediction`, `node_classification`: PBG's ranking protocol, F1 scores.
- `GraphSpec`, `write_graph`, `generate`: power-law graphs with planted communities.
"""

from .config import EmbedConfig
from .evaluate import evaluate_link_prediction, node_classification
from .generate import GraphSpec, generate, split_edges, write_graph
from .graph import EdgeList, read_edges, write_edges
from .output import load_embeddings, save_embeddings
from .table import EmbeddingTable
from .trainer import EmbeddingTrainer

__all__ = ["EmbedConfig", "EmbeddingTrainer", "EmbeddingTable", "EdgeList", "read_edges",
           "write_edges", "evaluate_link_prediction", "node_classification", "GraphSpec",
           "generate", "split_edges", "write_graph", "save_embeddings", "load_embeddings"]
