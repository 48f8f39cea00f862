"""The user's commands on the GPU, as a user runs them from the source tree. (GPU)

    OUTCORE_COMMIT=<sha> PYTHONPATH=src python3 bench/cli_gpu.py [--out cli-h200]

About 4-6 minutes on one H200. The CPU suite runs every command here on the CPU; this
runs them where a GPU user does, at HEAD: the demo (`outcore train` with no arguments),
`train --model 1b --compile-kernels`, a run killed by SIGKILL and then `--resume`d against
one never interrupted (and the same run twice, to tell the GPU's own run-to-run
difference from resume's), `plan`, `gemm` (fp32 and bf16), `embed` on a generated graph with
held-out edges, and two bad inputs. Each command is a subprocess under a time limit; its
row keeps the exit code, wall time, a check that could fail and the figures it printed.
Writes bench/results/<out>.json (the full output of each command in <out>.log), a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import torch

ROOT = common.ROOT
ENV = dict(os.environ, PYTHONUNBUFFERED="1",
           PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
CLI = [sys.executable, "-m", "outcore.cli"]


def run(argv: list[str], timeout: float, log: list[str]) -> tuple[int, str, float]:
    """argv's exit code (124 past timeout), its stdout+stderr and wall seconds."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=timeout)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""     # bytes here, though text=True (the run was cut)
        rc, text = 124, out.decode(errors="replace") if isinstance(out, bytes) else out
    wall = time.perf_counter() - t0
    log.append(f"$ {' '.join(argv)}\n[rc {rc}, {wall:.1f} s]\n{text}\n")
    return rc, text, wall


def losses(out: Path) -> list[float]:
    f = out / "metrics.jsonl"
    return [json.loads(ln)["loss"] for ln in f.read_text().splitlines()] if f.exists() else []


def summary(text: str) -> dict:
    """The figures of `outcore train`'s summary lines."""
    got = {}
    for key, pat in (("tokens_per_s", r"([\d,]+) tokens/s"),
                     ("device_peak", r"device peak ([\d.]+ [KMGT]iB)"),
                     ("host_bytes_per_param", r"([\d.]+) host bytes/param")):
        m = re.search(pat, text)
        if m:
            got[key] = m.group(1).replace(",", "") if key == "tokens_per_s" else m.group(1)
    got["on_gpu"] = "device: cuda" in text
    return got


def trained(name, argv, timeout, out, log) -> dict:
    """A `train` run: it must exit 0 on the GPU with a summary and a falling loss."""
    rc, text, wall = run(argv, timeout, log)
    ls = losses(out)
    row = {"case": name, "rc": rc, "wall_s": wall, **summary(text),
           "first_loss": ls[0] if ls else None, "last_loss": ls[-1] if ls else None}
    row["ok"] = (rc == 0 and "summary:" in text and row["on_gpu"] and len(ls) > 1
                 and ls[-1] < ls[0])
    return row


def masters(out: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(out / "final" / "outcore" / "master.safetensors"))


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def resume_rows(tmp: Path, log: list[str]) -> list[dict]:
    """8 steps never interrupted (twice), and a run SIGKILLed after 5 logged steps then
    --resume'd: its final masters against the first reference, beside the references'
    own difference (the GPU's kernels need not be bitwise repeatable)."""
    def args(out):
        return CLI + ["train", "--max-steps", "8", "--save-every", "2", "--output-dir", str(out),
                      "--no-tensorboard", "--seed", "1"]
    refs = [tmp / "ref1", tmp / "ref2"]
    for r in refs:
        run(args(r), 180, log)
    killed = tmp / "killed"
    p = subprocess.Popen(args(killed), env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while len(losses(killed)) < 5 and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    rc, text, wall = run(args(killed) + ["--resume"], 180, log)
    m = re.search(r"at step (\d+)", text)
    row = {"case": "train-sigkill-resume", "rc": rc, "wall_s": wall,
           "killed_rc": p.returncode, "resumed_at": int(m.group(1)) if m else None,
           "steps_logged": len(losses(killed))}
    try:
        row["max_diff_vs_ref"] = max_diff(masters(killed), masters(refs[0]))
        row["max_diff_ref_vs_ref"] = max_diff(masters(refs[1]), masters(refs[0]))
    except (OSError, AssertionError, RuntimeError) as e:
        row["error"] = str(e)[:200]
    row["bitwise"] = row.get("max_diff_vs_ref") == 0.0
    row["ok"] = (rc == 0 and p.returncode == -signal.SIGKILL and row["resumed_at"] is not None
                 and row["steps_logged"] == 8 and "max_diff_vs_ref" in row
                 and row["max_diff_vs_ref"] <= max(row["max_diff_ref_vs_ref"], 0.0) * 4 + 1e-6)
    return [row]


def demo(tmp, log):
    return [trained("demo", CLI + ["train", "--output-dir", str(tmp / "demo")], 300,
                    tmp / "demo", log)]


def train_1b(tmp, log):
    return [trained("train-1b", CLI + ["train", "--model", "1b", "--compile-kernels",
                                       "--max-steps", "20", "--no-tensorboard",
                                       "--output-dir", str(tmp / "1b")], 300, tmp / "1b", log)]


def plan_gemm(tmp, log):
    rc, text, wall = run(CLI + ["plan", "--model", "7b"], 120, log)
    rows = [{"case": "plan-7b", "rc": rc, "wall_s": wall, "ok": rc == 0 and "B/param" in text}]
    for dt, extra in (("fp32", []), ("bf16", ["--compute", "bf16"])):
        rc, text, wall = run(CLI + ["gemm", "--m", "16384", "--n", "16384", "--k", "16384",
                                    "--dtype", "float32", *extra], 180, log)
        m = re.search(r"([\d.]+) TFLOP/s;", text)
        rows.append({"case": f"gemm-16384-{dt}", "rc": rc, "wall_s": wall,
                     "tflops": float(m.group(1)) if m else None,
                     "ok": rc == 0 and m is not None and re.search(r"check: .*: ok", text)
                     is not None})
    return rows


def embed(tmp, log):
    """3 epochs on a generated 200k-node graph, MRR on 1% held-out edges; the check: at least
    5x the MRR of random vectors of the same shape on the same held-out edges."""
    import numpy as np

    from outcore.embed.evaluate import evaluate_link_prediction
    from outcore.embed.generate import GraphSpec, split_edges, write_graph
    from outcore.embed.graph import read_edges
    edges = tmp / "graph.tsv"
    write_graph(GraphSpec(num_nodes=200_000, num_edges=2_000_000), str(edges))
    rc, text, wall = run(CLI + ["embed", str(edges), "--out", str(tmp / "emb.npy"),
                                "--epochs", "3", "--holdout", "0.01", "--no-progress"], 240, log)
    m = re.search(r"MRR ([\d.]+)", text)
    el = read_edges(str(edges))
    _, (s, d) = split_edges(el.src, el.dst, 0.01, 0)   # the CLI's split (its --seed 0)
    rand = np.random.default_rng(0).standard_normal((el.num_nodes, 128), dtype=np.float32)
    chance = evaluate_link_prediction(rand, s, d)["mrr"]
    mrr = float(m.group(1)) if m else None
    return [{"case": "embed-200k", "rc": rc, "wall_s": wall, "mrr": mrr, "random_mrr": chance,
             "ok": rc == 0 and mrr is not None and mrr > 5 * chance}]


def bad_input(tmp, log):
    rows = []
    for name, argv in (("bad-budget", ["train", "--model", "7b", "--gpu-memory", "1GiB",
                                        "--output-dir", str(tmp / "bad")]),
                       ("bad-model", ["train", "--model", "nosuch"])):
        rc, text, wall = run(CLI + argv, 120, log)
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        rows.append({"case": name, "rc": rc, "wall_s": wall,
                     "message": lines[-1][:300] if lines else "",
                     "ok": rc not in (0, 124) and "Traceback" not in text
                     and lines[-1].startswith("outcore: error:")})
    return rows


CASES = {"demo": demo, "train-1b": train_1b, "resume": resume_rows, "plan-gemm": plan_gemm,
         "embed": embed, "bad-input": bad_input}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=f"cli-{common.machine_name()}")
    ap.add_argument("--only", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    args = ap.parse_args()
    doc = common.header("cli_gpu")
    log: list[str] = []
    with tempfile.TemporaryDirectory() as d:
        for name in args.only.split(","):
            doc["runs"] += CASES[name](Path(d), log)
    rows = doc["runs"]
    doc["all_ok"] = all(r["ok"] for r in rows)
    path = common.write(doc, args.out)
    path.with_suffix(".log").write_text("\n".join(log))
    print(common.table(rows, ["case", "ok", "rc", "wall_s", "tokens_per_s", "device_peak",
                              "last_loss", "max_diff_vs_ref", "max_diff_ref_vs_ref", "tflops",
                              "mrr", "random_mrr", "message"]))
    print(f"wrote {path}; torch {torch.__version__}")
    return 0 if doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
