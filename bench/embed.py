#!/usr/bin/env python3
"""Benchmark of outcore.embed against PyTorch-BigGraph (PBG) on generated graphs.

    cd <repo> && PYTHONPATH=src python3 bench/embed.py            # about 8 min on 1 H200
    cd <repo> && PYTHONPATH=src python3 bench/embed.py            # about 5 min on 2 H200s
    PYTHONPATH=src python3 bench/embed.py --smoke                 # every path on the CPU, ~1 min
    PYTHONPATH=src python3 bench/embed.py --smoke --gpus 3        # 3 CPU ranks for the N-GPU rows

Writes bench/results/embed-h200.json (one GPU) or embed-h200xN.json (N GPUs: every visible
one, or --gpus N). Cases, all on graphs from outcore.embed.generate (power-law degrees,
planted communities):
  read-tsv         edges/s reading a TSV edge list: outcore's reader on the whole quality
                   graph; PBG's importer (torchbiggraph_import_from_tsv's code) on a sample
  quality          same graph (>= 1M nodes, >= 20M training edges), d=128, same negatives
                   (50 batch + 50 uniform per chunk of 50), same epochs, softmax loss, dot
                   score: pbg (CPU, all cores) and outcore (one GPU). Both embeddings are
                   scored by the same evaluator (PBG's protocol: 1000 batch + 1000 uniform
                   negatives, both sides): mrr, hits10, node-classification micro-F1; wall_s
                   is training time (PBG's import is reported apart, as import_s_est)
  throughput-1gpu  positive edges/s at d=128, table resident (median of epochs 2..n), with
                   the default negatives (63 batch + 64 sampled per side); the -light row
                   with 16 sampled negatives a side (GraphVite-like work per edge)
  throughput-1gpu-fused(-light)  kernel="fused" (one Triton kernel a step; chunks update
                   the table Hogwild-style) with the default and with the light negatives
  quality-fused-light  the quality graph trained by the fused kernel with the light
                   negatives (what its speed costs in MRR)
  throughput-Ngpu  the same with one process per GPU (N-GPU machine), speedup vs 1 GPU; the
                   graph has 2e8 edges per GPU (on more than two GPUs the 1-GPU rows time
                   2 epochs, not 4)
  fits-table       edges/s when the table fits the --gpu-memory budget
  oversized-table  edges/s when the table is 4x that budget (partitions streamed)
  gpu-check        partitioned training on the device with swaps every unit, against plain
                   dense PyTorch replaying the same steps (max_abs_err, ok)
  biggest          the largest graph this machine holds (1e8 nodes, 2e9 edges by default;
                   shrunk to the free host memory), time of one epoch
PBG needs the wheels in .whl/ (torchbiggraph 1.0.0, setuptools<81): installed at start into
/tmp/site when `import torchbiggraph` fails. PBG and `biggest` run in child processes with
time limits, so a hang or an out-of-memory kill becomes an error row. The results file is
rewritten after every case. The total is bounded by --budget-s.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "src"))

from outcore.embed import (EmbedConfig, EmbeddingTrainer, GraphSpec,  # noqa: E402
                           evaluate_link_prediction, node_classification, read_edges)
from outcore.embed.generate import PlantedGraph, write_graph  # noqa: E402
from outcore.embed.plan import make_plan  # noqa: E402
from outcore.embed.textio import parse_numeric_chunk  # noqa: E402

SITE = "/tmp/site"


# ---- sizes ----------------------------------------------------------------------------
def sizes(smoke: bool, gpus: int) -> dict:
    if smoke:
        return dict(q_nodes=2000, q_edges=30000, q_test=1000, q_epochs=1, tp_nodes=4000,
                    tp_edges=120000, tp_epochs=3, tp_epochs_one=3, big_nodes=20000,
                    big_edges=300000,
                    import_sample=2000, batch=8192, q_batch=4096, pbg_workers=2,
                    eval_negs=200)
    return dict(q_nodes=1_000_000, q_edges=20_100_000, q_test=100_000, q_epochs=2,
                tp_nodes=4_000_000, tp_edges=200_000_000 * max(1, gpus),
                tp_epochs=4, tp_epochs_one=4 if gpus <= 2 else 2, big_nodes=100_000_000,
                big_edges=2_000_000_000,
                import_sample=100_000, batch=262144, q_batch=65536,
                pbg_workers=os.cpu_count() or 16, eval_negs=1000)


# ---- PyTorch-BigGraph -----------------------------------------------------------------
def ensure_pbg() -> str:
    """Import torchbiggraph, installing the carried wheels into /tmp/site if needed."""
    try:
        import torchbiggraph  # noqa: F401
    except ImportError:
        wheels = glob.glob(os.path.join(REPO, ".whl", "*.whl"))
        if not wheels:
            raise RuntimeError("torchbiggraph is not installed and .whl/ has no wheels")
        if not os.path.isdir(os.path.join(SITE, "torchbiggraph")):
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                            "--no-deps", "--no-compile", "--target", SITE, *wheels],
                           check=True)
        sys.path.insert(0, SITE)
        import importlib
        importlib.invalidate_caches()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchbiggraph
    return torchbiggraph.__version__


def pbg_child(spec: dict) -> dict:
    """Runs in a child process: PBG import timing or training; returns its figures."""
    ensure_pbg()
    import logging
    import warnings
    warnings.simplefilter("ignore")
    logging.disable(logging.INFO)
    from torchbiggraph.config import parse_config
    from torchbiggraph.edgelist import EdgeList
    from torchbiggraph.entitylist import EntityList
    from torchbiggraph.graph_storages import EDGE_STORAGES, ENTITY_STORAGES
    from torchbiggraph.util import SubprocessInitializer
    work = spec["work"]
    base = dict(entities={"node": {"num_partitions": 1}},
                relations=[{"name": "e", "lhs": "node", "rhs": "node", "operator": "none"}],
                entity_path=os.path.join(work, "ent"), checkpoint_path=os.path.join(work, "ckpt"),
                edge_paths=[os.path.join(work, "edges")], dimension=spec.get("dim", 128),
                global_emb=False, comparator="dot", loss_fn="softmax",
                num_epochs=spec.get("epochs", 1), lr=spec.get("lr", 0.1),
                batch_size=spec.get("batch", 1000), num_batch_negs=spec.get("chunk", 50),
                num_uniform_negs=spec.get("negs", 50), workers=spec.get("workers", 2),
                eval_fraction=0.0, verbose=0)
    if spec["kind"] == "import":
        from torchbiggraph.converters.import_from_tsv import convert_input_data
        from pathlib import Path
        cfg = parse_config(dict(base, edge_paths=[os.path.join(work, "imp")]))
        t = time.perf_counter()
        convert_input_data(cfg.entities, cfg.relations, cfg.entity_path, cfg.edge_paths,
                           [Path(spec["tsv"])], lhs_col=0, rhs_col=1)
        return {"import_s": time.perf_counter() - t}
    # training: write PBG's own HDF5 input directly (its TSV importer would take most of
    # the budget; it is timed on a sample instead)
    from torchbiggraph.checkpoint_manager import CheckpointManager
    from torchbiggraph.train import train
    e = np.load(spec["edges"])
    n = spec["nodes"]
    ent = ENTITY_STORAGES.make_instance(base["entity_path"])
    ent.prepare()
    ent.save_count("node", 0, n)
    es = EDGE_STORAGES.make_instance(base["edge_paths"][0])
    es.prepare()
    es.save_edges(0, 0, EdgeList(EntityList.from_tensor(torch.from_numpy(e[:, 0].astype(np.int64))),
                                 EntityList.from_tensor(torch.from_numpy(e[:, 1].astype(np.int64))),
                                 torch.zeros(len(e), dtype=torch.long)))
    del e
    cfg = parse_config(base)
    t = time.perf_counter()
    train(cfg, subprocess_init=SubprocessInitializer())
    wall = time.perf_counter() - t
    emb, _ = CheckpointManager(base["checkpoint_path"]).read("node", 0)
    np.save(spec["out"], emb.numpy())
    return {"wall_s": wall}


def run_child(kind: str, spec: dict, timeout: float) -> dict:
    """Run this script as a child (`--_child kind`), return its JSON; raise on failure."""
    spec_path = os.path.join(spec["work"], f"{kind}-spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", kind, spec_path]
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "src") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 5), env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{kind} did not finish within {timeout:.0f} s (time budget)")
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{kind} failed (exit {p.returncode}): {' | '.join(tail)}"[:400])
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- outcore measurements -------------------------------------------------------------
def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gb() -> float | None:
    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None


# kernel="fused" configurations (chunk sizes and negatives must be powers of two):
#   default: 63 batch + 64 sampled negatives per chunk of 64, each side
#   light:   16 sampled, no batch ones (GraphVite-like work per edge)
# (63 batch + 16 sampled hit an illegal memory access on the H200, results/
# embed-h200-crashed.json; the kernel now refuses fewer sampled than batch negatives)
FUSED = {"default": dict(kernel="fused", chunk_size=64, num_negatives=64),
         "light": dict(kernel="fused", chunk_size=64, num_negatives=16, batch_negatives=False)}


def train_measure(src, dst, n, devices, epochs, **kw) -> tuple[dict, EmbeddingTrainer]:
    """Train; edges/s from the median epoch after the first (the first pays setup)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cfg = EmbedConfig(dim=128, epochs=epochs, devices=devices, progress=False, **kw)
    tr = EmbeddingTrainer(cfg)
    t = time.perf_counter()
    tr.fit((src, dst), num_nodes=n)
    sync()
    wall = time.perf_counter() - t
    ep = tr.summary["epoch_s"]
    timed = ep[1:] if len(ep) > 1 else ep
    c = tr.cfg
    negs = (f"{c.chunk_size - 1 if c.batch_negatives else 0} batch + {c.num_negatives} sampled "
            f"(degree^{c.neg_power}) per chunk of {c.chunk_size}, each side")
    row = {"edges_per_s": len(src) / statistics.median(timed), "epoch_s": [round(x, 4) for x in ep],
           "negatives": negs,
           "wall_s": wall, "partitions": tr.plan.partitions, "resident_partitions": tr.plan.capacity,
           "batch_size": tr.cfg.batch_size, "dim": 128, "nodes": n, "edges": len(src),
           "peak_gpu_gb": peak_gb()}
    if hasattr(tr, "summary_io"):
        row.update({"h2d_gb": tr.summary_io["bytes_in"] / 1e9, "d2h_gb": tr.summary_io["bytes_out"] / 1e9})
    return row, tr


def gen_edges(n, m, device, communities, seed=0, mixing=0.1):
    """Generated graph in memory: (src, dst) int32, labels."""
    pg = PlantedGraph(GraphSpec(n, m, communities=communities, mixing=mixing, seed=seed), device)
    src, dst = np.empty(m, np.int32), np.empty(m, np.int32)
    done = 0
    for u, v in pg.chunks(1 << 26):
        src[done:done + len(u)], dst[done:done + len(u)] = u, v
        done += len(u)
    labels = pg.labels
    del pg
    return src, dst, labels


def biggest_child(spec: dict) -> dict:
    dev = spec["device"]
    t = time.perf_counter()
    src, dst, _ = gen_edges(spec["nodes"], spec["edges"], dev, 1000, seed=7)
    gen_s = time.perf_counter() - t
    row, tr = train_measure(src, dst, spec["nodes"], [dev], 1, batch_size=spec["batch"],
                            shuffle=False)
    tr.close()
    row.update({"generate_s": gen_s, "epoch_s_one": row["epoch_s"][0],
                "table_gb": tr.plan.table_bytes / 1e9})
    return row


def free_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            info = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in f}
        return info.get("MemAvailable", info.get("MemFree", 0))
    except OSError:
        return 8 << 30


# ---- the run --------------------------------------------------------------------------
class Results:
    def __init__(self, path, machine, command):
        self.path = path
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        import common
        commit = common.git_commit()
        self.doc = {"benchmark": "embed", "command": command, "commit": commit,
                    "machine": machine, "gpus": gpus, "torch": torch.__version__,
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "cpu_cores": os.cpu_count(), "runs": [], "notes": []}

    def add(self, row: dict) -> dict:
        self.doc["runs"].append({k: (round(v, 6) if isinstance(v, float) else v)
                                 for k, v in row.items()})
        self.save()
        tag = row.get("error") or {k: row[k] for k in ("edges_per_s", "mrr", "hits10", "wall_s",
                                                       "speedup") if k in row}
        print(f"[{row['system']:8s} {row['case']:16s}] {tag}", flush=True)
        return row

    def note(self, text: str) -> None:
        self.doc["notes"].append(text)
        self.save()

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            json.dump(self.doc, f, indent=2)

    def table(self) -> str:
        lines = [f"{'system':9s} {'case':17s} {'edges/s':>11s} {'mrr':>7s} {'hits10':>7s} "
                 f"{'wall_s':>8s}  other"]
        for r in self.doc["runs"]:
            f = lambda k, fmt: (fmt.format(r[k]) if isinstance(r.get(k), (int, float)) else "-")
            other = r.get("error", "")[:60] or ", ".join(
                f"{k}={r[k]:.3g}" if isinstance(r[k], float) else f"{k}={r[k]}"
                for k in ("speedup", "ratio_to_fits", "micro_f1", "table_over_budget", "epoch_s_one",
                          "max_abs_err", "mrr_minus_pbg")
                if k in r)
            lines.append(f"{r['system']:9s} {r['case']:17s} {f('edges_per_s', '{:11.3e}')} "
                         f"{f('mrr', '{:7.4f}')} {f('hits10', '{:7.4f}')} {f('wall_s', '{:8.2f}')}  {other}")
        return "\n".join(lines)


def case(res: Results, system: str, name: str, fn, deadline: float, need_s: float):
    """Run one case; failures (OOM included) and lack of time become error rows."""
    if time.time() + need_s > deadline:
        return res.add({"system": system, "case": name,
                        "error": f"skipped: less than {need_s:.0f} s of the time budget left"})
    try:
        row = fn()
        return res.add({"system": system, "case": name, **row})
    except Exception as e:      # noqa: BLE001 - every failure is a row, not a crash
        msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:400]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return res.add({"system": system, "case": name, "error": msg})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Duration: about 8 min on one H200, 5 min on two; "
                                 "--smoke about 1 min on a CPU.")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, every path")
    ap.add_argument("--gpus", type=int, help="GPUs to use (default: every visible one; with "
                    "--smoke, CPU ranks of the multi-device rows, default 2)")
    ap.add_argument("--budget-s", type=float, help="total time bound (default 470 s on one "
                    "GPU, 290 s on two, 300 s smoke)")
    ap.add_argument("--out", help="results file (default bench/results/embed-<machine>.json)")
    ap.add_argument("--skip-pbg", action="store_true")
    ap.add_argument("--cases", help="comma list of groups to run: check,quality,throughput,"
                    "biggest (default: all that fit the machine)")
    ap.add_argument("--big-nodes", type=int, help="nodes of the biggest case (default 1e8, "
                    "shrunk to free host memory)")
    ap.add_argument("--big-edges", type=int, help="edges of the biggest case (default 2e9)")
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        kind, spec_path = args._child
        with open(spec_path) as f:
            spec = json.load(f)
        out = pbg_child(spec) if kind.startswith("pbg") else biggest_child(spec)
        print(json.dumps(out))
        return 0

    t_start = time.time()
    cuda = torch.cuda.is_available() and not args.smoke
    interp = False
    if not cuda:
        # the fused kernel's paths run on the CPU under Triton's interpreter, if installed
        os.environ.setdefault("TRITON_INTERPRET", "1")
        try:
            import triton  # noqa: F401
            interp = True
        except ImportError:
            pass
    gpus = 0 if not cuda else min(args.gpus or torch.cuda.device_count(),
                                  torch.cuda.device_count())
    budget = args.budget_s or (300 if args.smoke else (290 if gpus == 2 else 470))
    multi_devs = [f"cuda:{i}" for i in range(gpus)] if cuda else ["cpu"] * max(2, args.gpus or 2)
    deadline = t_start + budget
    machine = "cpu-smoke" if not cuda else ("nvidia-h200" if gpus == 1 else f"nvidia-h200-x{gpus}")
    short = "cpu-smoke" if not cuda else ("h200" if gpus == 1 else f"h200x{gpus}")
    import common
    args.out = common.out_path(args.out, None)   # a bare name: bench/results/NAME.json
    out = args.out or (os.path.join(tempfile.gettempdir(), "embed-cpu-smoke.json") if not cuda
                       else os.path.join(HERE, "results", f"embed-{short}.json"))
    res = Results(out, machine, "python3 bench/embed.py " + " ".join(sys.argv[1:]))
    S = sizes(not cuda, gpus)
    forced = args.big_nodes is not None or args.big_edges is not None
    S["big_nodes"] = args.big_nodes or S["big_nodes"]
    S["big_edges"] = args.big_edges or S["big_edges"]
    S["big_forced"] = forced
    groups = set((args.cases or "check,quality,throughput,biggest").split(","))
    dev = "cuda:0" if cuda else "cpu"
    devs1 = [dev]
    work = tempfile.mkdtemp(prefix="embed-bench-")
    if cuda:   # warm up: CUDA context, cuBLAS, the allocator (not a case)
        a = torch.randn(4096, 4096, device=dev)
        (a @ a).sum().item()
        del a
    print(f"embed bench on {machine}: budget {budget:.0f} s, results -> {out}", flush=True)
    try:
        pbg_version = None if args.skip_pbg else ensure_pbg()
    except Exception as e:     # noqa: BLE001
        pbg_version = None
        res.note(f"PBG unavailable: {type(e).__name__}: {e}"[:300])
    if pbg_version:
        res.note(f"torchbiggraph {pbg_version} on {os.cpu_count()} CPU cores")

    multi_gpu_run = gpus > 1
    # ---- correctness of the device path: swaps and streams against a dense replay ------
    if "check" in groups:
        case(res, "outcore", "gpu-check", lambda: run_check(dev), deadline, 20)
        if cuda or interp:
            case(res, "outcore", "gpu-check-fused", lambda: run_check_fused(dev), deadline, 20)
    # ---- quality graph, TSV reading, quality (one-GPU machine and smoke) -------------
    if not multi_gpu_run and "quality" in groups:
        run_quality(res, S, dev, work, deadline, pbg_version, fused_ok=cuda or interp)
    # ---- throughput -------------------------------------------------------------------
    if "throughput" in groups:
        run_throughput(res, S, devs1, gpus, cuda, deadline, fused_ok=cuda or interp,
                       multi_devs=multi_devs)
    # ---- biggest ----------------------------------------------------------------------
    if not multi_gpu_run and "biggest" in groups:
        import gc
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()     # the child needs the memory this process cached
        run_biggest(res, S, dev, work, deadline, cuda)
    if multi_gpu_run:
        res.note("multi-GPU run: quality, table-size and biggest cases run on the one-GPU "
                 "machine")
    shutil.rmtree(work, ignore_errors=True)
    res.doc["total_s"] = round(time.time() - t_start, 1)
    res.save()
    print(res.table())
    print(f"total {time.time() - t_start:.0f} s; wrote {out}")
    return 0


def run_check(dev) -> dict:
    """Partitioned training on the device (6 partitions, 2 resident: swaps every unit)
    against plain dense PyTorch replaying the same steps on the CPU."""
    from outcore.embed.reference import replay_dense
    rng = np.random.default_rng(0)
    N, E, P = 3000, 30000, 6
    src, dst = rng.integers(0, N, E), rng.integers(0, N, E)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    cfg = EmbedConfig(dim=32, epochs=2, batch_size=4096, chunk_size=32, num_negatives=16,
                      partitions=P, devices=[dev], progress=False, tf32=False, lr=0.05,
                      init_scale=0.5, edge_chunk=3000)
    probe = make_plan(cfg, N, 1, 1 << 60, len(src))
    cfg.gpu_memory = probe.workspace_bytes + 2 * probe.partition_bytes + 8
    tr = EmbeddingTrainer(cfg)
    records = []
    # clone on the device: no host sync per step, so the check runs the real overlap
    tr.record = lambda *r: records.append([x.clone() if torch.is_tensor(x) else x for x in r])
    tr.fit((src, dst), num_nodes=N)
    got = tr.table.gather(np.arange(N))
    want = replay_dense([[x.cpu() if torch.is_tensor(x) else x for x in r] for r in records],
                        cfg, N, P)
    err = float((got - want).abs().max())
    return {"max_abs_err": err, "ok": err < 1e-3, "steps": len(records),
            "resident_partitions": tr.plan.capacity, "partitions": P,
            "h2d_gb": tr.summary_io["bytes_in"] / 1e9}


def run_check_fused(dev) -> dict:
    """The fused Triton step on the GPU against its plain-torch emulation, on a batch whose
    rows are all distinct (so the parallel chunks cannot interact). Chunks of 32 keep the
    dot operands in fp32 (chunks of 64 need more shared memory than an H200 has)."""
    from outcore.embed.fused import emulate, fused_step
    torch.manual_seed(0)
    C = M = 32
    cfg = EmbedConfig(dim=128, chunk_size=C, num_negatives=M, lr=0.1, kernel="fused")
    n, B = 100_000, 256
    K = B // C
    ids = torch.randperm(n)[:2 * B + 2 * K * M].to(dev)
    u, v = ids[:B], ids[B:2 * B]
    nu, nv = ids[2 * B:2 * B + K * M], ids[2 * B + K * M:]
    rows = (torch.randn(n + 1, 128) * 0.3).to(dev)
    state = torch.rand(n + 1, 1).to(dev)
    r1, s1 = rows.clone(), state.clone()
    loss = torch.zeros(1, device=dev)
    fused_step(r1, s1, r1, s1, u, v, nu, nv, cfg, 0, 0, loss)
    r2, s2 = rows.clone(), state.clone()
    want = emulate(r2, s2, r2, s2, u, v, nu, nv, cfg, 0, 0)
    err = float((r1 - r2).abs().max())
    return {"max_abs_err": err, "state_err": float((s1 - s2).abs().max()),
            "loss_rel_err": float(abs(loss[0].cpu() - want.cpu()) / abs(want.cpu())),
            "ok": err < 2e-3, "note": "tl.dot runs in TF32 on the GPU, the emulation in fp32"}


def run_quality(res, S, dev, work, deadline, pbg_version, fused_ok=False):
    n, m = S["q_nodes"], S["q_edges"]
    tsv = os.path.join(work, "quality.tsv")
    t = time.perf_counter()
    spec = GraphSpec(n, m, communities=max(4, n // 1000), mixing=0.1, seed=1)
    write_graph(spec, tsv, os.path.join(work, "labels.tsv"), device=dev)
    with open(os.path.join(work, "labels.tsv"), "rb") as f:
        labels = parse_numeric_chunk(f.read(), 2, 1, "labels.tsv", False)[0][:, 1]
    res.note(f"quality graph: {n} nodes, {m} edges, {spec.communities} communities, generated "
             f"and written as TSV in {time.perf_counter() - t:.1f} s")
    box = {}

    def read_case():
        t = time.perf_counter()
        el = read_edges(tsv)
        dt = time.perf_counter() - t
        box["el"] = el
        return {"edges_per_s": len(el) / dt, "wall_s": dt, "edges": len(el),
                "bytes": os.path.getsize(tsv)}
    case(res, "outcore", "read-tsv", read_case, deadline, 10)
    if "el" not in box:
        return
    el = box.pop("el")
    rng = np.random.default_rng(0)
    test = np.zeros(len(el), bool)
    test[rng.choice(len(el), S["q_test"], replace=False)] = True
    tr_s, tr_d = el.src[~test], el.dst[~test]
    te_s, te_d = el.src[test], el.dst[test]
    read_rate = res.doc["runs"][-1].get("edges_per_s")
    common = dict(lr=0.1, loss="softmax", score="dot", chunk_size=50, num_negatives=50,
                  neg_power=0.0, batch_negatives=True)
    ev = dict(batch_negs=S["eval_negs"], uniform_negs=S["eval_negs"], device=dev, seed=3)

    def quality_outcore():
        row, tr = train_measure(tr_s, tr_d, n, [dev], S["q_epochs"], batch_size=S["q_batch"],
                                **common)
        m_ = evaluate_link_prediction(tr.table, te_s, te_d, **ev)
        nc = node_classification(tr.embeddings(), labels, device=dev)
        return {"mrr": m_["mrr"], "hits10": m_["hits10"], "micro_f1": nc["micro_f1"],
                "macro_f1": nc["macro_f1"], "wall_s": row["wall_s"],
                "wall_with_read_s": row["wall_s"] + len(el) / read_rate,
                "train_edges": len(tr_s), "test_edges": len(te_s), "epochs": S["q_epochs"],
                "dim": 128, "negatives": "50 batch + 50 uniform per chunk of 50",
                "batch_size": row["batch_size"], "edges_per_s": row["edges_per_s"],
                "peak_gpu_gb": row["peak_gpu_gb"]}
    q = case(res, "outcore", "quality", quality_outcore, deadline, 20)
    if fused_ok:
        for name in ("light",):
            def quality_fused(name=name):
                cfg = dict(FUSED[name], lr=0.1, loss="softmax", score="dot", neg_power=0.0)
                row, tr = train_measure(tr_s, tr_d, n, [dev], S["q_epochs"],
                                        batch_size=S["q_batch"], **cfg)
                m_ = evaluate_link_prediction(tr.table, te_s, te_d, **ev)
                return {"mrr": m_["mrr"], "hits10": m_["hits10"], "wall_s": row["wall_s"],
                        "epochs": S["q_epochs"], "dim": 128, "negatives": row["negatives"],
                        "edges_per_s": row["edges_per_s"], "kernel": "fused"}
            case(res, "outcore", f"quality-fused-{name}", quality_fused, deadline, 20)
    if not pbg_version:
        res.add({"system": "pbg", "case": "quality", "error": "torchbiggraph unavailable"})
        return
    # PBG's TSV importer on a sample
    sample = os.path.join(work, "sample.tsv")
    with open(tsv, "rb") as f, open(sample, "wb") as g:
        for _ in range(S["import_sample"]):
            g.write(f.readline())

    def pbg_import():
        r = run_child("pbg-import", {"kind": "import", "work": os.path.join(work, "pbgimp"),
                                      "tsv": sample}, min(120, deadline - time.time() - 60))
        box["import_rate"] = S["import_sample"] / r["import_s"]
        return {"edges_per_s": box["import_rate"], "wall_s": r["import_s"],
                "edges": S["import_sample"], "note": "importer timed on a sample of the file"}
    os.makedirs(os.path.join(work, "pbgimp"), exist_ok=True)
    case(res, "pbg", "read-tsv", pbg_import, deadline, 60)

    def pbg_quality():
        wd = os.path.join(work, "pbg")
        os.makedirs(wd, exist_ok=True)
        ep = os.path.join(wd, "train.npy")
        np.save(ep, np.stack([tr_s, tr_d], 1))
        outp = os.path.join(wd, "emb.npy")
        left = deadline - time.time() - 150          # keep time for the biggest case
        r = run_child("pbg-train", {"kind": "train", "work": wd, "edges": ep, "nodes": n,
                                     "out": outp, "epochs": S["q_epochs"], "dim": 128,
                                     "chunk": 50, "negs": 50, "batch": 1000, "lr": 0.1,
                                     "workers": S["pbg_workers"]}, left)
        emb = np.load(outp)
        m_ = evaluate_link_prediction(emb, te_s, te_d, **ev)
        nc = node_classification(emb, labels, device=dev)
        row = {"mrr": m_["mrr"], "hits10": m_["hits10"], "micro_f1": nc["micro_f1"],
               "macro_f1": nc["macro_f1"], "wall_s": r["wall_s"],
               "edges_per_s": len(tr_s) * S["q_epochs"] / r["wall_s"],
               "train_edges": len(tr_s), "test_edges": len(te_s), "epochs": S["q_epochs"],
               "dim": 128, "workers": S["pbg_workers"]}
        if "import_rate" in box:
            row["import_s_est"] = len(el) / box["import_rate"]
        return row
    p = case(res, "pbg", "quality", pbg_quality, deadline, 60)
    if "error" not in p and "error" not in q:
        res.add({"system": "outcore", "case": "quality-vs-pbg",
                 "mrr_minus_pbg": q["mrr"] - p["mrr"], "speedup": p["wall_s"] / q["wall_s"],
                 "speedup_with_read_vs_train_only": p["wall_s"] / q["wall_with_read_s"]})


def run_throughput(res, S, devs1, gpus, cuda, deadline, fused_ok=True, multi_devs=()):
    n, m = S["tp_nodes"], S["tp_edges"]
    t = time.perf_counter()
    src, dst, _ = gen_edges(n, m, devs1[0], communities=max(4, n // 1000), seed=2)
    res.note(f"throughput graph: {n} nodes, {m} edges, generated in {time.perf_counter() - t:.1f} s")
    kw = dict(batch_size=S["batch"], shuffle=False)      # generated edges are in random order
    box = {}

    def one():
        row, tr = train_measure(src, dst, n, devs1, S["tp_epochs_one"], **kw)
        box["one"] = row["edges_per_s"]
        box["table"] = tr.plan.table_bytes
        return row
    case(res, "outcore", "throughput-1gpu", one, deadline, 30)

    def light():
        # GraphVite-like work per edge: 16 shared sampled negatives a side, no batch ones
        row, _ = train_measure(src, dst, n, devs1, S["tp_epochs"], chunk_size=64,
                               num_negatives=16, batch_negatives=False, **kw)
        return dict(row, negatives="16 sampled per chunk of 64, each side")
    if gpus <= 1:
        case(res, "outcore", "throughput-1gpu-light", light, deadline, 30)

    def one_fused(name="default"):
        def run():
            # under Triton's CPU interpreter (smoke) a few thousand edges are plenty
            cut = None if cuda else 4096
            row, _ = train_measure(src[:cut], dst[:cut], n, devs1,
                                   S["tp_epochs_one"] if cuda else 2,
                                   **FUSED[name], **kw)
            box["one-fused" + ("" if name == "default" else f"-{name}")] = row["edges_per_s"]
            from outcore.embed.fused import low_precision_dots
            lowp = any(low_precision_dots().values())
            return dict(row, kernel="fused (Triton; Hogwild within a batch)",
                        dot_operands="bf16 (fp32 did not fit shared memory)" if lowp else "fp32")
        return run

    def multi(devs, fused: bool):
        def run():
            extra = FUSED["default"] if fused else {}
            row, tr = train_measure(src, dst, n, devs, S["tp_epochs"], **extra, **kw)
            tr.close()
            row["devices"] = len(devs)
            row["rank_wait_s"] = [round(r["wait_s"], 3) for r in tr.rank_stats]
            base = box.get("one-fused" if fused else "one")
            if base:
                row["speedup"] = row["edges_per_s"] / base
            return row
        return run

    if gpus > 1 or not cuda:
        devs = list(multi_devs)
        case(res, "outcore", f"throughput-{len(devs)}gpu", multi(devs, False), deadline, 60)
        if cuda:
            case(res, "outcore", "throughput-1gpu-fused", one_fused(), deadline, 30)
            case(res, "outcore", f"throughput-{len(devs)}gpu-fused", multi(devs, True),
                 deadline, 60)
    if gpus > 1:
        return
    probe = make_plan(EmbedConfig(dim=128, batch_size=S["batch"]), n, 1, 1 << 60, m)
    ws = probe.workspace_bytes          # step temporaries, edge buffers, sampling tables
    table = probe.table_bytes

    def fits():
        row, _ = train_measure(src, dst, n, devs1, S["tp_epochs"], gpu_memory=ws + 2 * table,
                               **kw)
        box["fits"] = row["edges_per_s"]
        return dict(row, gpu_memory_gb=(ws + 2 * table) / 1e9, table_gb=table / 1e9)
    case(res, "outcore", "fits-table", fits, deadline, 30)

    def oversized():
        budget = ws + table // 4
        row, tr = train_measure(src, dst, n, devs1, S["tp_epochs"], gpu_memory=budget, **kw)
        row.update(gpu_memory_gb=budget / 1e9, table_gb=table / 1e9,
                   table_over_budget=table / (budget - ws))
        if "fits" in box:
            row["ratio_to_fits"] = row["edges_per_s"] / box["fits"]
        return row
    case(res, "outcore", "oversized-table", oversized, deadline, 40)
    if fused_ok:
        case(res, "outcore", "throughput-1gpu-fused", one_fused(), deadline, 30)
        case(res, "outcore", "throughput-1gpu-fused-light", one_fused("light"), deadline, 30)


def run_biggest(res, S, dev, work, deadline, cuda):
    n, m = S["big_nodes"], S["big_edges"]
    need = m * 8 + n * 129 * 4 + n * 40          # edges, table (+state), degrees/cdf
    free = free_host_bytes()
    while not S["big_forced"] and need > 0.7 * free and m > 1_000_000:
        n, m = n // 2, m // 2
        need = m * 8 + n * 129 * 4 + n * 40
    if (n, m) != (S["big_nodes"], S["big_edges"]):
        res.note(f"biggest: shrunk to {n} nodes, {m} edges for {free / 2**30:.0f} GiB free host "
                 "memory (MemAvailable); --big-nodes/--big-edges override")

    def big():
        left = deadline - time.time() - 5
        r = run_child("biggest", {"work": work, "device": dev, "nodes": n, "edges": m,
                                   "batch": S["batch"]}, left)
        return dict(r, note="one epoch; epoch_s_one includes setup of that epoch")
    case(res, "outcore", "biggest", big, deadline, 60 if cuda else 5)


if __name__ == "__main__":
    sys.exit(main())
