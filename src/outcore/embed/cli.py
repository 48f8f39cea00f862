"""`outcore embed EDGES ...` (train) and `outcore embed eval ...` (evaluate)."""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from ..errors import OutcoreError
from ..units import parse_bytes

EPILOG = """examples:
  outcore embed edges.tsv --dim 128 --epochs 10 --out emb.npy
  outcore embed edges.tsv --devices cuda:0,cuda:1 --gpu-memory 40GiB --out emb.safetensors
  torchrun --nproc-per-node 2 -m outcore.cli embed edges.tsv --out emb.npy   (one rank a GPU;
      across machines give --table-path on a filesystem all of them share)
  outcore embed eval --embeddings emb.npy --edges test.tsv --labels labels.tsv
Row i of the output is node i (integer ids 0..N-1); with string ids the mapping is written
beside it as OUT.ids.tsv. Directed runs write 2*dim columns: source vectors, then target."""


def register(sub) -> None:
    p = sub.add_parser("embed", help="node embeddings of an edge list (tables beyond GPU "
                       "memory); 'embed eval' scores them",
                       description="Train node embeddings of a graph given as an edge list "
                       "(TSV/CSV/whitespace text or .npy), or evaluate them with 'eval'.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="EDGES", help="edge list file, or 'eval'")
    t = p.add_argument_group("training")
    t.add_argument("--out", help="output file: .npy, .safetensors or .tsv")
    t.add_argument("--format", choices=["npy", "safetensors", "tsv"])
    t.add_argument("--dim", type=int, help="vector size (default 128; directed runs write 2*dim "
                   "columns); eval reads it from the file")
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--lr", type=float, default=0.1)
    t.add_argument("--optimizer", choices=["adagrad", "adam"], default="adagrad")
    t.add_argument("--score", choices=["dot", "cosine"], default="dot")
    t.add_argument("--loss", choices=["softmax", "logistic", "ranking"], default="softmax")
    t.add_argument("--batch-size", type=int, help="positive edges per step (default: E/64 "
                   "within 4096..262144)")
    t.add_argument("--chunk-size", type=int, default=64)
    t.add_argument("--negatives", type=int, default=64, help="sampled negatives per chunk")
    t.add_argument("--neg-power", type=float, default=0.75, help="negatives ~ degree**p")
    t.add_argument("--mode", choices=["edges", "deepwalk", "node2vec"], default="edges")
    t.add_argument("--walk-length", type=int, default=20)
    t.add_argument("--walks-per-node", type=int, default=1)
    t.add_argument("--window", type=int, default=3)
    t.add_argument("--p", type=float, default=1.0)
    t.add_argument("--q", type=float, default=1.0)
    t.add_argument("--directed", action="store_true")
    t.add_argument("--partitions", type=int)
    t.add_argument("--devices", help="cpu, cuda:0,cuda:1, or a GPU count (default cuda:0, or "
                   "the CPU without a GPU)")
    t.add_argument("--gpu-memory", help="device memory for the table per device, e.g. 8GiB")
    t.add_argument("--table-path", help="memory-mapped table file (tables larger than RAM)")
    t.add_argument("--num-nodes", type=int)
    t.add_argument("--header", action=argparse.BooleanOptionalAction, default=None)
    t.add_argument("--self-loops", choices=["drop", "keep", "error"], default="drop")
    t.add_argument("--holdout", type=float, default=0.0,
                   help="hold out this share of edges and report link prediction at the end")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-progress", action="store_true")
    e = p.add_argument_group("eval")
    e.add_argument("--embeddings", help="embeddings file written by 'outcore embed'")
    e.add_argument("--edges", dest="eval_edges", help="held-out edges to rank")
    e.add_argument("--labels", help="'node label' lines for node classification")
    e.add_argument("--eval-negatives", type=int, default=1000,
                   help="uniform negatives per chunk (and chunk size), as PyTorch-BigGraph")
    e.add_argument("--device", default="cpu")
    e.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(func=run)


def _devices(spec):
    if spec is None:
        return []
    if spec.isdigit():
        return int(spec)
    return [d.strip() for d in spec.split(",") if d.strip()]


def run(args) -> int:
    if args.input == "eval":
        return run_eval(args)
    return run_train(args)


def run_train(args) -> int:
    from .config import EmbedConfig
    from .generate import split_edges
    from .graph import read_edges
    from .output import check_output_path
    from .trainer import EmbeddingTrainer
    if not args.out:
        raise OutcoreError("--out is required: where to write the embeddings (.npy, "
                           ".safetensors or .tsv)")
    check_output_path(args.out, args.format)     # before hours of training, not after
    if args.holdout and not 0.0 < args.holdout < 1.0:
        raise OutcoreError(f"--holdout {args.holdout} must be between 0 and 1 (the share of "
                           "edges held out for evaluation), e.g. --holdout 0.05")
    devices = _devices(args.devices)
    if isinstance(devices, int):
        devices = [f"cuda:{i}" for i in range(devices)]
    dim = 128 if args.dim is None else args.dim
    cfg = EmbedConfig(dim=dim, epochs=args.epochs, lr=args.lr, optimizer=args.optimizer,
                      score=args.score, loss=args.loss, batch_size=args.batch_size,
                      chunk_size=args.chunk_size, num_negatives=args.negatives,
                      neg_power=args.neg_power, mode=args.mode, walk_length=args.walk_length,
                      walks_per_node=args.walks_per_node, window=args.window, p=args.p,
                      q=args.q, directed=args.directed, partitions=args.partitions,
                      devices=devices, gpu_memory=parse_bytes(args.gpu_memory, "--gpu-memory"),
                      table_path=args.table_path, seed=args.seed,
                      progress=not args.no_progress).validate()
    t0 = time.perf_counter()
    el = read_edges(args.input, header=args.header, num_nodes=args.num_nodes,
                    self_loops=args.self_loops)
    read_s = time.perf_counter() - t0
    print(f"read {len(el):,} edges, {el.num_nodes:,} nodes from {args.input} in {read_s:.2f} s "
          f"({len(el) / max(read_s, 1e-9) / 1e6:.1f} M edges/s); self-loops dropped: "
          f"{el.stats.get('self_loops_dropped', 0)}")
    test = None
    if args.holdout:
        (s, d), test = split_edges(el.src, el.dst, args.holdout, args.seed)
        if len(s) == 0:
            raise OutcoreError(f"--holdout {args.holdout} holds out all {len(el):,} edges and "
                               "leaves none to train on: hold out a smaller share")
        if len(test[0]) == 0:
            print(f"note: --holdout {args.holdout} held out none of the {len(el):,} edges: "
                  "no link prediction is reported")
        el.src, el.dst = s, d
        if el.weight is not None:
            el.weight = None
            print("note: --holdout drops the weights (uniform edge sampling)")
    trainer = EmbeddingTrainer(cfg)
    try:
        trainer.fit(el)
        if trainer.rank != 0:
            return 0                  # under torchrun, rank 0 writes and reports
        files = trainer.save(args.out, args.format)
        print(trainer.describe())
        print("wrote " + ", ".join(files))
        if test is not None and len(test[0]):
            from .evaluate import evaluate_link_prediction
            m = evaluate_link_prediction(trainer.table, *test, directed=cfg.directed,
                                         score=cfg.score, dim=cfg.dim)
            print(f"link prediction on {m['count']:,} held-out edges: MRR {m['mrr']:.4f}, "
                  f"Hits@10 {m['hits10']:.4f}")
    finally:
        trainer.close()
    return 0


def read_labels(path: str, num_nodes: int, names: dict | None = None) -> np.ndarray:
    """'node label' lines -> N int64 labels (-1 where absent); labels may be strings."""
    if not os.path.isfile(path):
        raise OutcoreError(f"labels file {path!r} does not exist")
    labels = np.full(num_nodes, -1, dtype=np.int64)
    classes: dict = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            parts = line.replace(",", " ").split()
            if not parts or parts[0].startswith("#"):
                continue
            if len(parts) != 2:
                raise OutcoreError(f"{path}, line {i}: expected 'node label', got {line.strip()!r}")
            node = names.get(parts[0]) if names is not None else None
            if node is None:
                try:
                    node = int(parts[0])
                except ValueError:
                    if i == 1:
                        continue          # a header
                    raise OutcoreError(f"{path}, line {i}: node {parts[0]!r} is unknown") from None
            if not 0 <= node < num_nodes:
                raise OutcoreError(f"{path}, line {i}: node {node} is outside 0..{num_nodes - 1}")
            labels[node] = classes.setdefault(parts[1], len(classes))
    return labels


def _eval_dim(args, width: int) -> int:
    """Vector size to score with: the file's width (half of it with --directed, where rows
    are source then target vectors); --dim, if given, must agree with it."""
    if args.directed and width % 2:
        raise OutcoreError(f"{args.embeddings} has {width} columns, but --directed embeddings "
                           "have 2*dim (source then target): drop --directed")
    d = width // 2 if args.directed else width
    if args.dim is not None and args.dim != d:
        how = " (source, then target)" if args.directed else ""
        raise OutcoreError(f"--dim {args.dim} does not match {args.embeddings}: its {width} "
                           f"columns hold vectors of size {d}{how}; drop --dim or pass --dim {d}")
    return d


def run_eval(args) -> int:
    from .evaluate import evaluate_link_prediction, node_classification
    from .graph import read_edges
    from .output import load_embeddings
    if not args.embeddings:
        raise OutcoreError("embed eval needs --embeddings FILE (and --edges and/or --labels)")
    if not (args.eval_edges or args.labels):
        raise OutcoreError("embed eval needs --edges (held-out edges) and/or --labels")
    from .trainer import resolve_devices
    resolve_devices([args.device])            # a one-line error for cuda without CUDA
    if args.eval_negatives < 1:
        raise OutcoreError(f"--eval-negatives {args.eval_negatives} must be at least 1 (the "
                           "uniform negatives per chunk of held-out edges, and its size)")
    emb = load_embeddings(args.embeddings)
    N = emb.shape[0]
    d = _eval_dim(args, emb.shape[1])
    names = None
    ids_path = args.embeddings + ".ids.tsv"
    if os.path.isfile(ids_path):
        with open(ids_path, encoding="utf-8") as f:
            names = {line.rstrip("\n").split("\t", 1)[1]: i for i, line in enumerate(f)}
    out = {}
    if args.eval_edges:
        if names is not None:
            el = read_edges(args.eval_edges, header=args.header, string_ids=True,
                            self_loops="keep")
            remap = np.array([names.get(n, -1) for n in el.names])
            src, dst = remap[el.src], remap[el.dst]
            keep = (src >= 0) & (dst >= 0)
            src, dst = src[keep], dst[keep]
        else:
            el = read_edges(args.eval_edges, header=args.header, num_nodes=N, self_loops="keep")
            src, dst = el.src, el.dst
        out["link_prediction"] = evaluate_link_prediction(
            emb, src, dst, directed=args.directed, score=args.score,
            dim=d, batch_negs=args.eval_negatives,
            uniform_negs=args.eval_negatives, device=args.device, seed=args.seed)
    if args.labels:
        labels = read_labels(args.labels, N, names)
        out["node_classification"] = node_classification(
            np.asarray(emb[:, :d]), labels, seed=args.seed, device=args.device)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        if "link_prediction" in out:
            m = out["link_prediction"]
            print(f"link prediction ({m['count']:,} edges): MRR {m['mrr']:.4f}  "
                  f"Hits@10 {m['hits10']:.4f}  Hits@1 {m['hits1']:.4f}  "
                  f"mean rank {m['mean_rank']:.1f}")
        if "node_classification" in out:
            m = out["node_classification"]
            print(f"node classification ({m['test_nodes']:,} test nodes, {m['classes']} "
                  f"classes): micro-F1 {m['micro_f1']:.4f}  macro-F1 {m['macro_f1']:.4f}")
    return 0
