#!/usr/bin/env python3
"""One device call's worth of benchmark commands, by name, with the results brought back.

    OUTCORE_COMMIT=<sha> PYTHONPATH=src python3 bench/gpu_session.py gemm --out-dir $OUT
    python3 bench/gpu_session.py --list                      # the steps and their commands

Each step is a few commands that belong in one call of the device tool (at most 10
minutes). They run one after the other, each under its own time limit; each one's output
goes to OUT_DIR/<step>-<i>.log, and every file of bench/results/ that the step wrote or
changed is added to OUT_DIR/results.tar (unpack it into bench/results/ here), so nothing
measured stays behind on the machine. A table of
the commands (exit status, seconds, the files they wrote) is printed last. A failed
command does not stop the step: the next one runs.
"""

from __future__ import annotations

import argparse
import os
import tarfile
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PY = [sys.executable]
B = "bench/"

# the planner rules of NOTES' next-session item 0 (bench/stream_ab.py's variants)
PLAN_VARIANTS = "balance,fixed-10,sim-model,slots4-i,slots4-i-sim"


def record(cases: str, out: str, timeout: int, *more: str) -> list[str]:
    """bench/stream.py on `cases` as the run of record runs them (the compiled model, no
    largest row, the GPU tests skipped), each (system, case) under `timeout` seconds."""
    return PY + [B + "stream.py", "--cases", cases, "--compiled", "--largest", "0",
                 "--skip-tests", "--timeout", str(timeout), "--out", out, *more]

# the bf16 TN shapes whose plans put the last tile on a new B panel (lone.by_columns)
TN_NEW_PANEL = "train-TN-t16384-f16384-bf16,train-TN-t32768-f16384-bf16"

# bf16-32768 and the bf16 training shapes whose plans A by rows changes (session 16)
A_ROWS_CASES = ",".join(["bf16-32768"] + [f"train-{lay}-t{t}-f{f}-bf16"
                                          for t in (16384, 32768, 65536)
                                          for f in (8192, 16384) for lay in ("NT", "NN")])

FP32_ROWS_CASES = ",".join(["fp32-16384"] + [f"train-{lay}-t{t}-f{f}-fp32"
                                             for t in (16384, 32768) for f in (8192, 16384)
                                             for lay in ("NT", "NN")])

NT_CASES = ",".join(f"train-NT-t{t}-f{f}-bf16" for t in (16384, 32768, 65536)
                    for f in (8192, 16384))
TN_CASES = NT_CASES.replace("-NT-", "-TN-")
# the bf16 training shapes whose plans model.D2H_ROWS changes (session 19)
D2H_CASES = ",".join(["train-NT-t16384-f16384-bf16", "train-NT-t32768-f8192-bf16",
                      "train-NT-t32768-f16384-bf16", "train-NT-t65536-f8192-bf16",
                      "train-NT-t65536-f16384-bf16", "train-TN-t32768-f16384-bf16"])
D2H2_CASES = ",".join(["train-NT-t16384-f16384-bf16", "train-NT-t32768-f16384-bf16",
                       "train-NT-t65536-f16384-bf16", "train-TN-t32768-f16384-bf16"])
# bf16-32768 and the 18 bf16 training shapes
BF16_CASES = ",".join(["bf16-32768"] + [f"train-{lay}-t{t}-f{f}-bf16"
                                        for t in (16384, 32768, 65536) for f in (8192, 16384)
                                        for lay in ("NT", "NN", "TN")])
# the bf16 training shapes whose plans lone.SHORT_STRIP_MAX_M changes (session 20)
SHORT_CASES = ",".join(f"train-{lay}-t16384-f{f}-bf16" for f in (8192, 16384)
                       for lay in ("NT", "NN"))
T16_BF16 = ",".join(f"train-{lay}-t16384-f{f}-bf16" for f in (8192, 16384)
                    for lay in ("NT", "NN", "TN"))
SPREAD_CASES = ",".join(["fp32-16384", "bf16-32768", "train-NN-t32768-f8192-bf16",
                         "train-TN-t16384-f16384-bf16", "train-NT-t16384-f8192-bf16"])
LAZY_CASES = ",".join(["fp32-16384", "train-NN-t16384-f8192-fp32", T16_BF16])
SIDE_VARIANTS = {"side1024": ["--flat-sides", "1024,2048,4096,8192"],
                 "side2048": ["--flat-sides", "2048,4096,8192"],
                 "side512": ["--flat-sides", "512,1024,2048,4096,8192"]}
D2H_VARIANTS = {"wide": ["--d2h-table", "16:0.73,32:0.87,64:0.94,1024:1.0"],
                "mid": ["--d2h-table", "16:0.73,32:0.97,64:1.0"],
                "off": ["--d2h-rows", "off"]}

def accs_pairs(pairs, alternate: bool) -> list:
    """bench/gemm.py at bf16-32768 and fp32-16384 with 4 accumulators and with 2, a pair
    per index (files gemm-h200-s16-acc{4,2}-I); alternate: odd pairs run 2 first."""
    out = []
    for i in pairs:
        runs = [(60, PY + [B + "gemm.py"] + (["--accs", "4"] if n == 4 else [])
                 + ["--cases", "bf16-32768,fp32-16384", "--runs", "5", "--out",
                    f"gemm-h200-s16-acc{n}-{i}"]) for n in (4, 2)]
        out += runs[::-1] if alternate and i % 2 else runs
    return out


# name: [(seconds allowed, command)], the next GPU session's plan (bench/NOTES.md)
# tile_ab.py's variant of the host rules before session 27 (copies as torch views in a
# stream context, three new streams a product, the arena's room by a snapshot)
OLD_HOST = "set=worker.REUSE_STREAMS=0+set=arena.SKIP_SNAPSHOT=0"

STEPS: dict[str, list[tuple[int, list[str]]]] = {
    # nvidia-h200: the stream GPU tests, then outcore alone at compiled 3b-16k: the default
    # (balance, tail order, keep_weights), the planner in the interleaved order, 12 blocks
    # interleaved (0.865 s against the default's 0.877 in session 9's A/B); 1b-16k likewise
    "order-ab": [(430, PY + [B + "stream_ab.py", "--variants", "balance,interleave,keep-12i",
                             "--tag", "order"]),
                 (140, PY + [B + "stream_ab.py", "--case", "1b-16k", "--variants",
                             "balance,interleave", "--skip-tests", "--tag", "order"])],
    # nvidia-h200: the H200 host's CPU AdamW with and without the bf16 copy (one pass:
    # stream/cast_kernel.py), then outcore alone at 3b-16k with the copies written in the
    # AdamW's pass against the default
    # (adamw_cast.py ran in session 10's gemm step: adamw-cast-h200.json)
    "copy-ab": [(560, PY + [B + "stream_ab.py", "--variants", "balance,fused-copy",
                            "--tag", "copy"])],
    # nvidia-h200: 3b-16k with every system (the GPU tests first), then outcore alone with
    # host_weight_copy="fused" (its kernel lets go of the GIL since session 10's copy-ab)
    # appended to the same file: both outcore variants against the same PyTorch run
    "copy-record": [(460, PY + [B + "stream.py", "--cases", "3b-16k", "--compiled",
                                "--largest", "0", "--timeout", "150", "--out",
                                "stream-h200-s10"]),
                    (130, PY + [B + "stream.py", "--cases", "3b-16k", "--systems", "outcore",
                                "--compiled", "--largest", "0", "--fused-copy",
                                "--skip-tests", "--append", "--out", "stream-h200-s10"])],
    # nvidia-h200: the GPU tests and outcore alone at 3b-16k with the default since
    # session 10 (host_weight_copy="auto": the fused copies where the host has room)
    "auto-check": [(330, PY + [B + "stream.py", "--cases", "3b-16k", "--systems", "outcore",
                               "--compiled", "--largest", "0", "--timeout", "150", "--out",
                               "stream-h200-s10-auto"])],
    # nvidia-h200: the run of record (its GPU tests first) at 3b-16k and 1b-16k; session
    # 13's ran past 570 s before FSDP2 1b-16k (the tests took 141 s): 1b-16k is appended
    # by the next call, `stream-record-1b`
    "stream-record": [(570, PY + [B + "stream.py", "--cases", "3b-16k", "--compiled",
                                  "--largest", "0", "--timeout", "200"])],
    "stream-record-1b": [(330, PY + [B + "stream.py", "--cases", "1b-16k", "--compiled",
                                     "--largest", "0", "--skip-tests", "--append",
                                     "--timeout", "150"])],
    # nvidia-h200, after stream-record: 3b-64k appended, the gemm GPU tests (the arena's
    # budget test has not run), the Linear layer against 8 GiB (within_budget?)
    "stream-64k-gemm": [(320, PY + [B + "stream.py", "--cases", "3b-64k", "--compiled",
                                    "--largest", "0", "--skip-tests", "--append",
                                    "--timeout", "170"]),
                        (150, PY + ["-m", "pytest", "-x",
                                    "tests/gemm/test_gemm_gpu.py"]),
                        (120, PY + [B + "gemm_linear.py"])],
    # nvidia-h200: the largest row appended; the gemm bench under a time budget
    "stream-largest": [(270, PY + [B + "stream.py", "--cases", "", "--skip-tests",
                                   "--append"])],
    # nvidia-h200's host, no GPU used: the CPU AdamW (what bounds 3b-16k) with torch's
    # allocations on transparent huge pages (THP_MEM_ALLOC_ENABLE=1: madvise on buffers of
    # 2 MiB and more) and without; on the 2-core development machine: no difference
    "thp-ab": [(150, PY + [B + "adamw_cast.py", "--out", "adamw-cast-h200-thp0"]),
               (150, PY + [B + "adamw_cast.py", "--thp", "--out", "adamw-cast-h200-thp1"])],
    # nvidia-h200: the gemm GPU tests (the arena's budget test failed in session 9), the
    # Linear layer against 8 GiB, the allocations behind its peak, the host's AdamW rates
    "gemm": [(150, PY + ["-m", "pytest", "-x", "tests/gemm/test_gemm_gpu.py"]),
             (150, PY + [B + "gemm_linear.py"]),
             (100, PY + [B + "diag/gemm_linear_mem.py", "--features", "65536", "--tokens",
                         "4096", "--gpu-memory", "8GiB", "--min-mib", "256"]),
             (150, PY + [B + "adamw_cast.py"])],
    # nvidia-h200: outcore alone at 3b-16k with two steps under the profiler: the table,
    # the longest gaps and a compact timeline (stream-timeline-*.json.gz) to read offline
    # where the 0.2 s between the blocks' compute (0.68 s) and the step (0.89 s) goes
    "stream-prof": [(300, PY + [B + "stream.py", "--cases", "3b-16k", "--systems", "outcore",
                                "--compiled", "--largest", "0", "--skip-tests", "--profile",
                                "--timeout", "250", "--out", "stream-h200-s14-prof"])],
    # nvidia-h200 (session 14): the GPU test of lazy copies under a d2h stream running
    # behind, then outcore alone at 3b-16k: the default, lazy copies, lazy with rest and
    # 9 blocks on the device
    "lazy-ab": [(120, PY + ["-m", "pytest", "-x", "tests/stream/test_gpu.py", "-k",
                            "behind"]),
                (470, PY + [B + "stream_ab.py", "--variants", "balance,lazy,lazy-9",
                            "--skip-tests", "--tag", "lazy"])],
    # nvidia-h200 (session 14): the GPU tests of lazy copies and resident m, v under a d2h
    # stream running behind, then 3b-16k outcore alone: the default, and lazy copies with
    # 3 blocks' m, v resident, with and without the kept weights
    "res-ab": [(120, PY + ["-m", "pytest", "-x", "tests/stream/test_gpu.py", "-k",
                           "behind"]),
               (450, PY + [B + "stream_ab.py", "--variants", "balance,res3,res3-nokeep",
                           "--skip-tests", "--tag", "res"])],
    # nvidia-h200 (session 14, last call): the host's AdamW with and without huge pages,
    # then every stream GPU test (lazy copies touched the default path's weight source)
    "thp-tests": [(150, PY + [B + "adamw_cast.py", "--out", "adamw-cast-h200-thp0"]),
                  (150, PY + [B + "adamw_cast.py", "--thp", "--out", "adamw-cast-h200-thp1"]),
                  (240, PY + ["-m", "pytest", "-x", "tests/stream/test_gpu.py"])],
    # nvidia-h200 (session 14, the last 260 s): the probe's strip variants, then the square
    # cases with the default strips (4) and with 8
    "strips-ab": [(90, PY + [B + "gemm_probe.py"]),
                  (75, PY + [B + "gemm.py", "--no-train", "--out", "gemm-h200-s14-sq"]),
                  (75, PY + [B + "gemm.py", "--no-train", "--max-strips", "8", "--out",
                             "gemm-h200-s14-sq-strips8"])],
    # nvidia-h200 (session 15): the gemm GPU tests (the CPU's band among them), then the
    # square fp32 cases with and without the host's band beside the GPU, and bf16, 5 runs
    "band-ab": [(170, PY + ["-m", "pytest", "-x", "tests/gemm/test_gemm_gpu.py"]),
                (300, PY + [B + "gemm.py", "--with-cpu", "--cases",
                            "fp32-16384,fp32-32768,bf16-32768", "--runs", "5", "--out",
                            "gemm-h200-s15-band"])],
    # nvidia-h200 (session 15, after band-ab): the gemm GPU tests again (band-ab's stopped at
    # the band test's first form), then 1b-16k with every system (no stream code changed
    # since stream-record's GPU tests passed), to its own file for bench/merge_parts.py
    "s15-final": [(170, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                  (330, PY + [B + "stream.py", "--cases", "1b-16k", "--compiled",
                              "--largest", "0", "--skip-tests", "--timeout", "150", "--out",
                              "stream-h200-s15-1b"])],
    # nvidia-h200 (session 15, after s15-final): the band's GPU test, whose monkeypatch
    # named the function outcore.gemm.matmul instead of the module there
    "band-tests": [(150, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py", "-k",
                               "band"])],
    # nvidia-h200: the gemm GPU tests alone (the strip blocks have not run under them)
    "gemm-tests": [(150, PY + ["-m", "pytest", "-x", "tests/gemm/test_gemm_gpu.py"])],
    # nvidia-h200 (session 16): the tiles' kernels and the square products under cuBLAS
    # and under cuBLASLt (torch.backends.cuda.preferred_blas_library), cuBLASXt beside
    "blas-probe": [(300, PY + [B + "diag/blas_backend.py"])],
    # nvidia-h200 (session 16): the gemm GPU tests (A by rows among them), then bf16-32768
    # and the bf16 NT/NN training shapes with A's panels by rows (the new default) and
    # without, then bf16-32768 by rows again (drift between the two runs)
    "arows-ab": [(150, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                 (150, PY + [B + "gemm.py", "--cases", A_ROWS_CASES, "--runs", "5", "--out",
                             "gemm-h200-s16-rows"]),
                 (150, PY + [B + "gemm.py", "--a-rows", "none", "--cases", A_ROWS_CASES,
                             "--runs", "5", "--out", "gemm-h200-s16-norows"]),
                 (90, PY + [B + "gemm.py", "--cases", "bf16-32768", "--runs", "5", "--out",
                            "gemm-h200-s16-rows2"])],
    # nvidia-h200 (session 16, after arows-ab): the A-by-rows GPU test again (its first
    # form asserted strips its plan did not have), then bf16-32768 with A by rows and in K
    # pieces, each timed and traced (why by rows did not gain there)
    # nvidia-h200 (session 16): fp32-16384 and the fp32 NT/NN training shapes whose plans
    # change where fp32 may copy A by rows too (the model: 0.6-2% faster), and as they are
    "fp32rows-ab": [(150, PY + [B + "gemm.py", "--a-rows", "bf16,fp32", "--cases",
                                FP32_ROWS_CASES, "--runs", "5", "--out",
                                "gemm-h200-s16-fp32rows"]),
                    (150, PY + [B + "gemm.py", "--cases", FP32_ROWS_CASES, "--runs", "5",
                                "--out", "gemm-h200-s16-fp32pieces"])],
    # nvidia-h200 (session 16, the last gemm call): the gemm GPU tests, then the whole gemm
    # bench at A by rows for bf16 (the run of record; session 14's kept as gemm-h200-s14)
    "s16-record": [(150, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                   (420, PY + [B + "gemm.py", "--budget-s", "330"])],
    # nvidia-h200 (session 16): 3b-64k outcore alone, the default (the step was 3.27 s
    # against 2.94 s of compute in session 11, with 0.35 s of host wait for the CPU AdamW
    # and no group on the device), then rest and blocks 1-2 updated on the device (the
    # next forward's first three groups, which the CPU finishes last)
    "s16-64k": [(250, PY + [B + "stream.py", "--cases", "3b-64k", "--systems", "outcore",
                            "--compiled", "--largest", "0", "--skip-tests", "--timeout",
                            "220", "--out", "stream-h200-s16-64k"]),
                (250, PY + [B + "stream.py", "--cases", "3b-64k", "--systems", "outcore",
                            "--compiled", "--largest", "0", "--skip-tests", "--gpu-updates",
                            "2", "--timeout", "220", "--out", "stream-h200-s16-64k-dev2"])],
    # nvidia-h200 (session 17): 3b-64k with the balance planner's head (rest and blocks
    # 1-2 on the device) and compute-bound rule, every system (a run-of-record candidate)
    "s17-64k": [(450, PY + [B + "stream.py", "--cases", "3b-64k", "--compiled", "--largest",
                            "0", "--skip-tests", "--timeout", "200", "--out",
                            "stream-h200-s17-64k"])],
    # nvidia-h200 (session 17): the stream GPU tests, then 3b-16k every system at the head's
    # commit (the rule should leave its choice alone: the model's best sits ~10% above the
    # compute there)
    "s17-16k": [(570, PY + [B + "stream.py", "--cases", "3b-16k", "--compiled", "--largest",
                            "0", "--timeout", "200", "--out", "stream-h200-s17-16k"])],
    # nvidia-h200 (session 17): 7b-16k outcore alone (does the head fit its budget? the
    # planner kept rest alone there in session 12, by the budget), then 1b-16k every system
    # nvidia-h200 (session 18): can the host cast a share of an fp32 operand to bf16 fast
    # enough to shorten the copies in of a bf16 product? Then FSDP2 at 7b-16k under a longer
    # limit (session 17's ran past 220 s; session 12's took 189 s), for the record's 7b part
    "s18-cast": [(150, PY + [B + "diag/host_cast.py"]),
                 (330, PY + [B + "stream.py", "--cases", "7b-16k", "--systems", "fsdp2",
                             "--compiled", "--largest", "0", "--skip-tests", "--timeout",
                             "300", "--out", "stream-h200-s18-7b-fsdp2"])],
    # nvidia-h200 (written in session 20, not run yet): the fp32 algorithms cuBLASLt offers
    # for outcore's tile shapes, timed beside torch's GEMM
    "lt-algos": [(420, PY + [B + "diag/lt_algos.py"])],
    # nvidia-h200 (session 23): a kernel's loads of pinned host memory (zero-copy) against
    # the DMA engines for narrow rows, each way, beside GEMMs
    "s23-zcopy": [(240, PY + [B + "diag/zcopy.py"])],
    # nvidia-h200 (session 23): fp32-16384's head, traced: the planner's 2048-deep pieces
    # against 4096-deep ones (session 22: 0.996x, where the link's rates say 2-3 ms less),
    # each product's whole timeline kept
    "s23-head": [(240, ["env", "PROBE_TRACED=auto,piece4096", "PROBE_TIMELINE=1"] + PY
                  + [B + "gemm_probe.py", "--only", "fp32-16384", "--no-kernels", "--out",
                     "gemm-probe-h200-s23"])],
    # nvidia-h200 (session 23, after a tile's pieces are enqueued as its GEMMs need them):
    # the gemm GPU tests; fp32-16384's variants (lazy, eager, smaller first pieces), two
    # traced; then lazy against eager on fp32-16384 and the shapes at 16384 tokens, two
    # rounds in opposite orders
    "s23-lazy": [(150, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                 (120, ["env", "PROBE_TRACED=auto,first512", "PROBE_TIMELINE=1"] + PY
                  + [B + "gemm_probe.py", "--only", "fp32-16384", "--no-kernels", "--out",
                     "gemm-probe-h200-s23-lazy"])] + [
        (60, PY + [B + "gemm.py", "--cases", LAZY_CASES, "--runs", "5"]
         + (["--eager-pieces"] if tag == "eager" else [])
         + ["--out", f"gemm-h200-s23-{tag}-{i}"])
        for i, order in ((1, ("lazy", "eager")), (2, ("eager", "lazy"))) for tag in order],
    # nvidia-h200 (session 23, after the lazy pieces became the default): the gemm run of
    # record at HEAD
    "s23-record": [(420, PY + [B + "gemm.py", "--budget-s", "330"])],
    # nvidia-h200 (session 23, at 4371896, whose plan.LAND_STRIDED has gone since): fp32-16384
    # with strided pieces landing contiguous first, traced, beside the planner's
    "s23-land": [(150, ["env", "PROBE_TRACED=land,piece4096-land", "PROBE_TIMELINE=1"] + PY
                  + [B + "gemm_probe.py", "--only", "fp32-16384", "--no-kernels", "--out",
                     "gemm-probe-h200-s23-land"])],
    # nvidia-h200 (session 23): four bf16 training shapes under 0.85 of the bound, traced
    # (the link's use each way by tenths of the product)
    "s23-trace": [(150, PY + [B + "diag/gemm_trace.py", "train-NT-t16384-f8192-bf16",
                              "train-NN-t16384-f8192-bf16", "train-TN-t16384-f8192-bf16",
                              "train-TN-t16384-f16384-bf16"])],
    # nvidia-h200 (session 23, at 61e17df, after Lanes.on switches streams by set_stream;
    # the switch is the gemm worker's alone since): its GPU test, then the new switch
    # against torch.cuda.stream() on the lazy A/B's cases, two rounds in opposite orders
    "s23-ctx": [(90, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py", "-k",
                           "lanes_on or matches_float64"])] + [
        (60, PY + [B + "gemm.py", "--cases", LAZY_CASES, "--runs", "5"]
         + (["--torch-stream-ctx"] if tag == "ctx" else [])
         + ["--out", f"gemm-h200-s23-{tag}-{i}"])
        for i, order in ((1, ("light", "ctx")), (2, ("ctx", "light"))) for tag in order],
    # nvidia-h200 (written in session 23, not run: its device time ran out): the gemm GPU
    # tests at the session's last engine
    "s23-tests": [(60, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"])],
    # nvidia-h200 (session 24; split copies and the --huge-pages host matrices were measured
    # at 6d306ff and a8c73e1, by steps s24-split and s24-pages, and left the library
    # since): the gemm run of record at HEAD
    "s24-record": [(420, PY + [B + "gemm.py", "--budget-s", "330"])],
    # nvidia-h200 (session 24): each product's time beside where its device arena began,
    # for the bf16 NT and NN shapes at 16384 tokens and 8192 features (NT alternated
    # between 19.1 and 17.8 ms, run after run, in the strips A/B)
    "s24-alt": [(120, PY + [B + "diag/alternation.py"])],
    # nvidia-h200 (session 24): the three bf16 TN shapes under 0.85 of the bound, in the
    # planner's tiles with copy pieces 512 to 4096 deep, round-robin in one process (the
    # model ties them: it does not count the host's work per piece)
    "s24-pieces": [(240, PY + [B + "diag/piece_sweep.py"])],
    # (session 24's s24-dma, at 9f5139a: direct copies on their streams with no stream
    # switch, copies.DMA_ON_STREAM, against the default; no faster, removed since)
    # nvidia-h200 (session 24): TN at 16384 tokens and features traced in the planner's
    # 8192-wide column strips and in 4096-wide ones (63 ms against 52 in s24-split)
    "s24-tntrace": [(120, ["env", "GEMM_TRACE_TAG=s24"] + PY + [
                        B + "diag/gemm_trace.py", "train-TN-t16384-f16384-bf16"]),
                    (120, ["env", "GEMM_TRACE_TAG=s24-t4096", "GEMM_TRACE_TILE=16384,4096"]
                     + PY + [B + "diag/gemm_trace.py", "train-TN-t16384-f16384-bf16"])],
    # nvidia-h200 (session 24, after the record): whole-width strips of 512 rows (the
    # default at 16384 tokens) against 1024 (--short-strip-max-m 0) on the six bf16 shapes
    # at 16384 tokens, whose host work per strip fell with the lazy pieces and the light
    # stream switch since session 19 chose 512; two rounds in opposite orders. Then TN at
    # 16384 tokens and 8192 features in the planner's 4096^2 tiles and forced 8192 x 4096
    # and 8192^2 ones (A's K pieces whole rows of A, one contiguous copy each)
    "s24-strips": [
        (60, PY + [B + "gemm.py", "--cases", T16_BF16, "--runs", "5"]
         + (["--short-strip-max-m", "0"] if tag == "strip1024" else [])
         + ["--out", f"gemm-h200-s24-{tag}-{i}"])
        for i, order in ((1, ("strip512", "strip1024")), (2, ("strip1024", "strip512")))
        for tag in order] + [
        (40, PY + [B + "gemm.py", "--cases", "train-TN-t16384-f8192-bf16", "--runs", "5"]
         + (["--tile", tile] if tile else []) + ["--out", f"gemm-h200-s24-tn8192-{name}"])
        for name, tile in (("planner", None), ("t8192x4096", "8192,4096"),
                           ("t8192x8192", "8192,8192"))],
    # nvidia-h200 (session 25): the gemm GPU tests with compute="tf32x3" (split.py), then
    # the square fp32 cases and two fp32 training shapes with its rows beside fp32's
    "s25-x3": [(150, PY + ["-m", "pytest", "-p", "no:warnings",
                           "tests/gemm/test_gemm_gpu.py"]),
               (240, PY + [B + "gemm.py", "--cases", "fp32-16384,fp32-32768,"
                           "train-NN-t16384-f8192-fp32,train-TN-t32768-f16384-fp32", "--runs", "5",
                           "--out", "gemm-h200-s25-x3"])],
    # nvidia-h200 (session 25): tf32x3's error against fp32's, in-core, by the K one GEMM
    # call sums (its first run had it 12-22x fp32's)
    "s25-x3acc": [(120, PY + [B + "diag/x3_accuracy.py"])],
    # nvidia-h200 (session 25): the same with split.py's large term in 2048-deep calls,
    # its product through outcore in three layouts, the GPU tests, the fp32 cases again
    "s25-x3b": [(90, PY + ["-m", "pytest", "-p", "no:warnings",
                           "tests/gemm/test_gemm_gpu.py", "-k", "tf32x3 or matches_float64"]),
                (150, PY + [B + "diag/x3_accuracy.py"]),
                (240, PY + [B + "gemm.py", "--cases", "fp32-16384,fp32-32768,"
                            "train-NN-t16384-f8192-fp32,train-TN-t32768-f16384-fp32", "--runs",
                            "5", "--out", "gemm-h200-s25-x3b"])],
    # nvidia-h200 (session 25): tf32x3's GEMM rate by tile shape (for the planner's model)
    # and its error on the GPU test's small tiles by split.BIG_CHUNK
    "s25-x3shapes": [(200, PY + [B + "diag/x3_shapes.py"])],
    # nvidia-h200 (session 25, after KERNEL_FIT["tf32x3"]): the GPU tests, then tf32x3's
    # large term in 2048-deep GEMM calls against 1024-deep, a process each, twice
    "s25-x3ab": [(60, PY + ["-m", "pytest", "-p", "no:warnings",
                            "tests/gemm/test_gemm_gpu.py", "-k", "tf32x3 or matches_float64"])]
    + [(90, PY + [B + "gemm.py", "--cases", "fp32-16384,train-NN-t16384-f8192-fp32,"
                  "train-NT-t16384-f8192-fp32", "--runs", "5", "--x3-chunk", str(kc),
                  "--out", f"gemm-h200-s25-x3k{kc}-{i}"])
       for i, order in ((1, (2048, 1024)), (2, (1024, 2048))) for kc in order],
    # nvidia-h200 (session 25, split.BIG_CHUNK 1024): the gemm run of record, with the
    # tf32x3 rows of every fp32 case, after the gemm GPU tests
    "s25-record": [(60, PY + ["-m", "pytest", "-p", "no:warnings",
                              "tests/gemm/test_gemm_gpu.py"]),
                   (540, PY + [B + "gemm.py", "--budget-s", "400"])],
    # nvidia-h200 (session 25): the cases s25-record's 400 s did not reach (the bf16
    # training shapes, then fp32's at 65536 tokens and 16384 features), for merge_parts.py
    "s25-rest": [(200, PY + [B + "gemm.py", "--cases", BF16_CASES.replace("bf16-32768,", "")
                             + "," + ",".join(f"train-{lay}-t65536-f16384-fp32"
                                              for lay in ("NT", "NN", "TN")),
                             "--budget-s", "170", "--out", "gemm-h200-s25-rest"])],
    # nvidia-h200 (written in session 25 for the next): the gemm GPU tests and the run of
    # record in one process with room for all 40 cases (session 25's 400 s reached 19)
    "s26-record": [(60, PY + ["-m", "pytest", "-p", "no:warnings",
                              "tests/gemm/test_gemm_gpu.py"]),
                   (530, PY + [B + "gemm.py", "--budget-s", "500"])],
    # nvidia-h200 (session 26): tf32x3 on Gram matrices; bf16-32768 traced (its record
    # ran 186-202 ms against the model's 173); then the record again with every element of
    # A, B and C drawn (fill_ on the GPU), so the sampled errors compare independent entries
    "s26-b": [(100, PY + [B + "diag/x3_gram.py"]),
              (120, ["env", "GEMM_TRACE_TAG=s26"] + PY + [B + "diag/gemm_trace.py",
                                                          "bf16-32768"]),
              (330, PY + [B + "gemm.py", "--budget-s", "280"])],
    # nvidia-h200 (session 26): the planner's tiles against square ones in the growing
    # order (C's copies out spread over the product) on bf16-32768 and two bf16 shapes
    # under 0.85 of the bound, alternating in one process
    "s26-tiles": [(300, ["env", "TILE_AB=planner,8192x8192,4096x8192,2048x32768"] + PY + [
        B + "diag/tile_ab.py", "bf16-32768", "train-NN-t16384-f8192-bf16",
        "train-TN-t16384-f16384-bf16"])],
    # nvidia-h200 (session 26): tf32x3's speed by the depth of its large term's calls
    # (x3-gram-h200.json: its error on sums of one sign halves with each halving), beside
    # fp32's, alternating in one process
    "s26-x3chunk": [(400, ["env", "TILE_AB=planner,compute=tf32x3+x3chunk=1024,"
                           "compute=tf32x3+x3chunk=512,compute=tf32x3+x3chunk=256",
                           "TILE_AB_TAG=x3chunk"] + PY + [
        B + "diag/tile_ab.py", "fp32-16384", "fp32-32768", "train-NT-t16384-f16384-fp32",
        "train-TN-t32768-f16384-fp32", "train-NN-t65536-f8192-fp32"])],
    # nvidia-h200 (session 26): the same five cases in five processes one after another
    # (bench/gemm.py each time: its own host matrices, bandwidth probe and in-core rates),
    # for the spread between processes that two records of one session showed
    "s26-spread": [(70, PY + [B + "gemm.py", "--cases", SPREAD_CASES, "--no-tf32x3",
                              "--budget-s", "60", "--out", f"gemm-h200-s26-spread-{i}"])
                   for i in range(1, 6)],
    # nvidia-h200 (session 26): the other capabilities' GPU tests at HEAD (transfer.py and
    # memory/ changed since the stream tests last ran on a GPU, session 20)
    "s26-gputests": [(240, PY + ["-m", "pytest", "-p", "no:warnings",
                                 "tests/stream/test_gpu.py"]),
                     (120, PY + ["-m", "pytest", "-p", "no:warnings",
                                 "tests/swap/test_swap_cuda.py", "tests/embed/test_fused.py"])],
    # nvidia-h200 (session 26): tf32x3's GEMM rates by tile shape at BIG_CHUNK 512, for a
    # refit of model.KERNEL_FIT["tf32x3"] (session 25's fit was at 2048)
    "s26-x3shapes": [(150, ["env", "X3_SHAPES_TAG=k512"] + PY + [B + "diag/x3_shapes.py"])],
    # nvidia-h200 (written in session 26 for the next): the five tf32x3 plans that the refit
    # of x3-shapes-h200-k512.json (edge 140, depth 400, peak 106.4) changes, the planner's
    # against the refit's, alternating in one process (tile_ab.py's x3fit variant); the
    # refit goes in only where it wins
    "s27-x3fit": [(300, ["env", "TILE_AB=compute=tf32x3,compute=tf32x3+x3fit=140:400:106.4",
                         "TILE_AB_TAG=x3fit"] + PY + [B + "diag/tile_ab.py"] + [
        f"train-{case}-fp32" for case in ("NT-t16384-f8192", "NN-t32768-f8192",
                                          "NN-t32768-f16384", "NN-t65536-f8192",
                                          "NT-t65536-f16384")])],
    # nvidia-h200 (written in session 26 for the next): the slow process (one in four or
    # five ran a product 8-14% slow, gemm-h200-s26-spread-*.json): the same two products
    # traced in five processes in a row, each its own timeline, to tell the link from the
    # host's pages from the device where one is slow
    "s27-slowproc": [(80, ["env", f"GEMM_TRACE_TAG=s27-p{i}"] + PY + [
        B + "diag/gemm_trace.py", "bf16-32768", "train-NN-t32768-f8192-bf16"])
                     for i in range(1, 6)],
    # nvidia-h200 (session 27): the host's time a product: streams kept per device, the
    # arena's snapshot skipped after its predecessor (the defaults since) against the
    # rules before them, alternating in one process on the short bf16 shapes whose hosts
    # spent 1 ms before the first copy (gemm-trace-h200-s27-p*.json); the GPU tests first,
    # one product's host profile last. (Its first form, s27-host at c34390c, also copied
    # by address: no faster, and its d2h failed in host_setup.py; removed.)
    "s27-host": [(150, PY + ["-m", "pytest", "-p", "no:warnings",
                             "tests/gemm/test_gemm_gpu.py"]),
                 (300, ["env", "TILE_AB=planner," + OLD_HOST, "TILE_AB_TAG=host2"] + PY + [
                     B + "diag/tile_ab.py"] + [
                     f"train-{case}-bf16" for case in (
                         "NT-t16384-f8192", "NN-t16384-f8192", "TN-t16384-f8192",
                         "NT-t16384-f16384", "NN-t16384-f16384", "NN-t32768-f8192",
                         "NT-t65536-f8192")] + ["fp32-16384"]),
                 (90, ["env", "HOST_SETUP_TAG=s27"] + PY + [B + "diag/host_setup.py"])],
    # nvidia-h200 (session 27): the first fp32 product of a fresh process (host_setup.py's
    # stopped with "invalid argument" at its first copy out in s27-host), by the CLI and
    # by matmul, in variants that tell cuBLASLt's kernel, the order and the size apart
    "s27-fresh": [(500, PY + [B + "diag/fresh_fp32.py"])],
    # nvidia-h200 (session 27): host_setup.py's failure (fresh_fp32.py's first products
    # all ran) with session 27's host rules, without them, and with launches blocking
    "s27-hostsetup": [(60, ["env", f"HOST_SETUP_TAG=s27{tag}"] + env + PY + [
        B + "diag/host_setup.py"]) for tag, env in (("-new", []), ("-old", ["HOST_SETUP_OLD=1"]),
                                                    ("-blocking", ["CUDA_LAUNCH_BLOCKING=1"]))],
    # nvidia-h200 (session 28): compute="strassen" (one Strassen-Winograd level in fp32
    # arithmetic, gemm/strassen.py): its GPU tests, then beside outcore's fp32 path,
    # cuBLASXt and in-core torch on the square fp32 cases and three training shapes
    "s28-strassen": [(120, PY + ["-m", "pytest", "-p", "no:warnings",
                                 "tests/gemm/test_gemm_gpu.py", "-k", "strassen"]),
                     (420, PY + [B + "gemm.py", "--cases", ",".join([
                         "fp32-16384", "fp32-32768", "train-NN-t16384-f8192-fp32",
                         "train-TN-t16384-f16384-fp32", "train-NT-t65536-f16384-fp32"]),
                         "--no-tf32x3", "--runs", "5", "--budget-s", "380",
                         "--out", "gemm-h200-s28-strassen"])],
    # nvidia-h200 (session 28): strassen with M7 moved up and whole copies after the first
    # quadrants, against the tiled fp32 path, and three switches (a short first piece,
    # 8 strips, the sums on a side stream), alternating in one process; then two traced
    "s28-strassen2": [(330, ["env", "TILE_AB=planner,compute=strassen,"
                             "compute=strassen+set=strassen.FIRST_PIECE=512,"
                             "compute=strassen+set=strassen.STRIPS=8,"
                             "compute=strassen+set=strassen_worker.SIDE_ADDS=1",
                             "TILE_AB_TAG=s28-strassen"] + PY + [
                                 B + "diag/tile_ab.py", "fp32-16384", "fp32-32768",
                                 "train-NN-t16384-f8192-fp32"]),
                      (120, ["env", "GEMM_TRACE_TAG=s28-strassen",
                             "GEMM_TRACE_COMPUTE=strassen"] + PY + [
                          B + "diag/gemm_trace.py", "fp32-16384",
                          "train-NN-t16384-f8192-fp32"])],
    # nvidia-h200 (session 28): strassen with the first quadrants' pieces alternating A's and
    # B's, and the three switches on (a 512-deep first piece, 8 strips, the sums on a side
    # stream) against them off and against each piece depth, alternating in one process;
    # the GPU tests first, a trace last
    "s28-strassen3": [(120, PY + ["-m", "pytest", "-p", "no:warnings",
                                  "tests/gemm/test_gemm_gpu.py", "-k", "strassen"]),
                      (330, ["env", "TILE_AB=planner,compute=strassen,compute=strassen+"
                             "set=strassen.FIRST_PIECE=0+set=strassen.STRIPS=4+"
                             "set=strassen_worker.SIDE_ADDS=0,"
                             "compute=strassen+set=strassen.FIRST_PIECE=1024,"
                             "compute=strassen+set=strassen_worker.SIDE_ADDS=0",
                             "TILE_AB_TAG=s28-strassen3"] + PY + [
                                 B + "diag/tile_ab.py", "fp32-16384", "fp32-32768",
                                 "train-NN-t16384-f8192-fp32", "train-TN-t16384-f16384-fp32",
                                 "train-NT-t65536-f16384-fp32"]),
                      (60, ["env", "GEMM_TRACE_TAG=s28-strassen3",
                            "GEMM_TRACE_COMPUTE=strassen"] + PY + [
                          B + "diag/gemm_trace.py", "fp32-16384"])],
    # nvidia-h200 (session 28): strassen with M1's GEMMs enqueued between its pieces'
    # copies (the host reached the first GEMM 2.4 ms after its pieces had landed): the GPU
    # tests, fp32-16384 traced, then the whole bench (the record) with the strassen rows
    "s28-record": [(120, PY + ["-m", "pytest", "-p", "no:warnings",
                               "tests/gemm/test_gemm_gpu.py"]),
                   (40, ["env", "GEMM_TRACE_TAG=s28-strassen4",
                         "GEMM_TRACE_COMPUTE=strassen"] + PY + [
                       B + "diag/gemm_trace.py", "fp32-16384"]),
                   (430, PY + [B + "gemm.py", "--budget-s", "400"])],
    # nvidia-h200 (session 28): strassen's first pieces growing 1.5x from 512 against 2048
    # right after the first, alternating in one process; then the TN shapes with 8192
    # features that strassen ran slower than the tiled fp32 path (gemm-h200.json at
    # c1626e2), traced under both
    "s28-ramp": [(200, ["env", "TILE_AB=compute=strassen,compute=strassen+set=strassen.RAMP=1",
                        "TILE_AB_TAG=s28-ramp"] + PY + [
                            B + "diag/tile_ab.py", "fp32-16384", "fp32-32768",
                            "train-NN-t16384-f8192-fp32"])] + [
        (60, ["env", f"GEMM_TRACE_TAG=s28-tn-{c}"] + (
            ["GEMM_TRACE_COMPUTE=strassen"] if c == "strassen" else []) + PY + [
            B + "diag/gemm_trace.py", "train-TN-t16384-f8192-fp32",
            "train-TN-t32768-f8192-fp32"]) for c in ("strassen", "fp32")],
    # nvidia-h200 (session 28): strassen's M2 and M7 by copy pieces (PIECEWISE) against
    # whole, alternating in one process, on the TN shapes it ran slower than the tiled
    # path and three others; the GPU tests first (both ways)
    "s28-piecewise": [(150, PY + ["-m", "pytest", "-p", "no:warnings",
                                  "tests/gemm/test_gemm_gpu.py", "-k", "strassen"]),
                      (300, ["env", "TILE_AB=planner,compute=strassen,"
                             "compute=strassen+set=strassen_worker.PIECEWISE=1",
                             "TILE_AB_TAG=s28-piecewise"] + PY + [
                                 B + "diag/tile_ab.py", "train-TN-t16384-f8192-fp32",
                                 "train-TN-t32768-f8192-fp32", "train-TN-t65536-f8192-fp32",
                                 "train-NN-t16384-f8192-fp32", "train-NT-t16384-f8192-fp32",
                                 "fp32-16384"])],
    # nvidia-h200 (session 28): the strassen GPU tests at HEAD, then every fp32 case of the
    # bench (no tf32x3 rows) with strassen's M2 and M7 by pieces where the rule says so
    "s28-fp32": [(100, PY + ["-m", "pytest", "-p", "no:warnings",
                             "tests/gemm/test_gemm_gpu.py", "-k", "strassen"]),
                 (280, PY + [B + "gemm.py", "--cases", ",".join(
                     ["fp32-16384", "fp32-32768"] + [
                         f"train-{lay}-t{t}-f{f}-fp32" for t in (16384, 32768, 65536)
                         for f in (8192, 16384) for lay in ("NT", "NN", "TN")]),
                     "--no-tf32x3", "--budget-s", "260", "--out", "gemm-h200-s28-fp32"])],
    # nvidia-h200 (session 29): the gemm GPU tests at HEAD; strassen's C12 strips of
    # STRIP_MIN elements at least against session 28's 8 always (STRIP_MIN=1), the TN shapes
    # with 8192 features (their 512-row strips ran at half rate) and NN 16384 x 8192 (8 ->
    # 4 strips); fp32-32768 under budgets that cut it (super-tiles, K blocks) both ways
    "s29-a": [(150, PY + ["-m", "pytest", "-p", "no:warnings",
                          "tests/gemm/test_gemm_gpu.py"]),
              (200, ["env", "TILE_AB=compute=strassen,compute=strassen+set=strassen."
                     "STRIP_MIN=1", "TILE_AB_TAG=s29-strips"] + PY + [
                         B + "diag/tile_ab.py", "train-TN-t16384-f8192-fp32",
                         "train-TN-t32768-f8192-fp32", "train-NN-t16384-f8192-fp32"]),
              (180, ["env", "TILE_AB=planner+mem=8GiB,compute=strassen+mem=8GiB,"
                     "compute=strassen+mem=4GiB", "TILE_AB_TAG=s29-budget"] + PY + [
                         B + "diag/tile_ab.py", "fp32-32768"])],
    # nvidia-h200 (session 29): STRIP_MIN 1024 x 4096 (NN 16384 x 8192 keeps its 8 strips,
    # the TN 8192-feature shapes 4) against call s29-a's 2048 x 4096; the other
    # capabilities' GPU tests at HEAD
    "s29-b": [(120, ["env", "TILE_AB=compute=strassen,compute=strassen+set=strassen."
                     "STRIP_MIN=8388608", "TILE_AB_TAG=s29-strips2"] + PY + [
                         B + "diag/tile_ab.py", "train-TN-t16384-f8192-fp32",
                         "train-TN-t32768-f8192-fp32", "train-TN-t65536-f8192-fp32",
                         "train-NN-t16384-f8192-fp32"]),
              (240, PY + ["-m", "pytest", "-p", "no:warnings", "tests/stream/test_gpu.py"]),
              (120, PY + ["-m", "pytest", "-p", "no:warnings",
                          "tests/swap/test_swap_cuda.py", "tests/embed/test_fused.py"])],
    # nvidia-h200 (session 29): issue 3's 3b-16k row again at HEAD, its peers in the same
    # run (the stream GPU tests passed in s29-b)
    "s29-3b16k": [(570, PY + [B + "stream.py", "--cases", "3b-16k", "--compiled",
                              "--largest", "0", "--skip-tests", "--timeout", "185",
                              "--out", "stream-h200-s29-3b16k"])],
    # nvidia-h200 (session 29): the bf16 TN shapes' tiles, the planner's against wider ones
    # it does not search (fewer than MIN_WIDE_TILES tiles: the 8192-feature shape's whole C
    # in one tile, 24.5 ms by the model against the chosen 2 x 2's 36; measured 23.6);
    # then the host's time before the first copy (host_setup.py)
    "s29-tn": [(150, ["env", "TILE_AB=planner,8192x8192,4096x8192,8192x4096",
                      "TILE_AB_TAG=s29-tn8k"] + PY + [
                          B + "diag/tile_ab.py", "train-TN-t16384-f8192-bf16",
                          "train-TN-t32768-f8192-bf16"]),
               (150, ["env", "TILE_AB=planner,16384x4096,8192x16384,16384x16384",
                      "TILE_AB_TAG=s29-tn16k"] + PY + [
                          B + "diag/tile_ab.py", "train-TN-t16384-f16384-bf16"]),
               (60, ["env", "HOST_SETUP_TAG=s29"] + PY + [B + "diag/host_setup.py"])],
    # nvidia-h200 (session 29): the 16 GiB Linear layer against 8 GiB at HEAD (last run in
    # session 10, at 8c7c00e), and under compute="strassen"
    "s29-linear": [(140, PY + [B + "gemm_linear.py", "--out", "gemm-linear-h200-s29"]),
                   (140, PY + [B + "gemm_linear.py", "--compute", "strassen", "--out",
                               "gemm-linear-h200-s29-strassen"])],
    # nvidia-h200 (session 30): 3b-16k outcore alone, 8 measured steps each: the default
    # (8 gradients staged for the CPU AdamW at most), no cap, and no cap with rest + 10
    # blocks fixed; then the same in the reverse order
    "s30-staged": [(570, PY + [B + "stream_ab.py", "--variants",
                               "balance,staged-free,staged-free-10", "--skip-tests",
                               "--steps", "8", "--tag", "s30a"])],
    "s30-staged2": [(570, PY + [B + "stream_ab.py", "--variants",
                                "staged-free-10,staged-free,balance", "--skip-tests",
                                "--steps", "8", "--tag", "s30b"])],
    "s30-staged3": [(570, PY + [B + "stream_ab.py", "--variants",
                                "staged-free,staged-free-10,balance", "--skip-tests",
                                "--steps", "8", "--tag", "s30c"])],
    # nvidia-h200 (session 30): 3b-16k with its peers in one run at the staging cap's new
    # default (no cap where the host has room); the stream GPU tests did not fit the
    # session's device time beside it
    "s30-3b16k": [(420, PY + [B + "stream.py", "--cases", "3b-16k", "--compiled",
                              "--largest", "0", "--skip-tests", "--timeout", "185",
                              "--out", "stream-h200-s30-3b16k"])],
    # nvidia-h200 (session 31): the stream GPU tests at HEAD (the staging cap's default and
    # the CPU worker's need order), then 3b-16k outcore alone, 8 measured steps each: the
    # CPU AdamW taking the landed gradient the next forward needs first (the default, in
    # the variant "balance") against the oldest first ("arrival"), both orders of the two
    "s31-order": [(240, PY + ["-m", "pytest", "-p", "no:warnings",
                              "tests/stream/test_gpu.py"]),
                  (330, PY + [B + "stream_ab.py", "--variants", "balance,arrival",
                              "--skip-tests", "--steps", "8", "--tag", "s31a"])],
    "s31-order2": [(280, PY + [B + "stream_ab.py", "--variants", v, "--skip-tests",
                               "--steps", "8", "--tag", tag])
                   for v, tag in (("arrival,balance", "s31b"), ("balance,arrival", "s31c"))],
    # nvidia-h200 (session 31, "arrival" the default again): 3b-64k outcore alone at the
    # staging cap's default (not run since session 30 lifted it), then 3b-16k with its
    # peers in one run at HEAD
    "s31-final": [(220, PY + [B + "stream.py", "--cases", "3b-64k", "--systems", "outcore",
                              "--compiled", "--largest", "0", "--skip-tests", "--timeout",
                              "190", "--out", "stream-h200-s31-64k"]),
                  (350, PY + [B + "stream.py", "--cases", "3b-16k", "--compiled",
                              "--largest", "0", "--skip-tests", "--timeout", "160",
                              "--out", "stream-h200-s31-3b16k"])],
    # the same after the machine was taken back mid-call, in the device time left:
    # 3b-64k outcore alone, then 3b-16k outcore and in-memory PyTorch (no FSDP2)
    "s31-short": [(190, PY + [B + "stream.py", "--cases", "3b-64k", "--systems", "outcore",
                              "--compiled", "--largest", "0", "--skip-tests", "--timeout",
                              "175", "--out", "stream-h200-s31-64k"]),
                  (170, PY + [B + "stream.py", "--cases", "3b-16k", "--systems",
                              "outcore,pytorch", "--compiled", "--largest", "0",
                              "--skip-tests", "--timeout", "110", "--out",
                              "stream-h200-s31-3b16k"])],
    # nvidia-h200 (session 32): the CPU AdamW pass writing the bf16 copies by non-temporal
    # stores (cast_kernel.STREAM_STORES): its rate alone and beside copies both ways, then
    # 3b-16k outcore alone, 8 measured steps, the default ("balance") against "nt"
    "s32-nt": [(150, PY + [B + "adamw_cast.py", "--copies", "--out", "adamw-cast-h200-s32"]),
               (330, PY + [B + "stream_ab.py", "--variants", "balance,nt", "--skip-tests",
                           "--steps", "8", "--tag", "s32a"])],
    "s32-nt2": [(280, PY + [B + "stream_ab.py", "--variants", v, "--skip-tests",
                            "--steps", "8", "--tag", tag])
                for v, tag in (("nt,balance", "s32b"), ("balance,nt", "s32c"))],
    # 3b-64k outcore alone with room for a fresh machine's first compile (session 31's run
    # timed out at 175 s), then 3b-16k with its peers, both at HEAD
    "s32-final": [(250, record("3b-64k", "stream-h200-s32-64k", 240, "--systems", "outcore")),
                  (330, record("3b-16k", "stream-h200-s32-3b16k", 150))],
    # the stream GPU tests at HEAD (the AdamW+cast kernel's loop was rewritten for the
    # opt-in stores), then the largest row (not run since session 18, before session 30's
    # staging default)
    "s32-check": [(240, PY + ["-m", "pytest", "-p", "no:warnings",
                              "tests/stream/test_gpu.py"]),
                  (300, PY + [B + "stream.py", "--cases", "", "--skip-tests", "--timeout",
                              "140", "--out", "stream-h200-s32-largest"])],
    # 3b-16k with its peers again at HEAD: the spread between two runs of the same commit
    "s32-again": [(330, record("3b-16k", "stream-h200-s32-3b16k-again", 150))],
    # nvidia-h200 (written in session 32, for the next): the planner's end count at
    # 3b-16k, outcore alone, 8 measured steps: the default against rest and 10 blocks
    # fixed, the simulation as the model, and 4 slots in the interleaved order planned by
    # either model (the simulation puts it 5-7% under the default's split at 2.5-4 G
    # params/s: bench/NOTES.md, session 32); then the reverse order
    "s33-plan": [(560, PY + [B + "stream_ab.py", "--variants", PLAN_VARIANTS,
                             "--skip-tests", "--steps", "8", "--tag", "s33a"])],
    "s33-plan2": [(560, PY + [B + "stream_ab.py", "--variants",
                              ",".join(reversed(PLAN_VARIANTS.split(","))), "--skip-tests",
                              "--steps", "8", "--tag", "s33b"])],
    # nvidia-h200 (session 33): s33-plan put slots4-i and slots4-i-sim behind the default
    # (0.963 and 0.921 s against 0.884); the other three in the reverse order
    "s33-plan3": [(400, PY + [B + "stream_ab.py", "--variants", "sim-model,fixed-10,balance",
                              "--skip-tests", "--steps", "8", "--tag", "s33b"])],
    # nvidia-h200 (session 33): the simulation as the planner's model led both orders
    # (0.873 vs 0.884 s, 0.849 vs 0.892): 3b-16k with its peers planned by it, then 7b-16k
    # outcore alone planned by it
    "s33-sim": [(330, record("3b-16k", "stream-h200-s33-3b16k-sim", 150,
                             "--balance-model", "simulate")),
                (230, record("7b-16k", "stream-h200-s33-7b16k-sim", 200, "--systems",
                             "outcore", "--balance-model", "simulate"))],
    # nvidia-h200 (written in session 33, for the next): the simulation as the planner's
    # model at the other cases before it can become the default: 1b-16k (the replayed
    # first plans of session 32's record put one group fewer there), two rounds, then
    # 3b-64k; then 3b-16k's third round
    "s34-sim1b": [(270, PY + [B + "stream_ab.py", "--case", "1b-16k", "--variants", v,
                              "--skip-tests", "--steps", "8", "--tag", tag])
                  for v, tag in (("balance,sim-model", "s34a"), ("sim-model,balance", "s34b"))],
    "s34-sim64k": [(560, PY + [B + "stream_ab.py", "--case", "3b-64k", "--variants",
                               "balance,sim-model", "--skip-tests", "--tag", "s34c"])],
    "s34-sim3": [(300, PY + [B + "stream_ab.py", "--variants", "balance,sim-model",
                             "--skip-tests", "--steps", "8", "--tag", "s34d"])],
    # nvidia-h200 (session 34): s34-sim1b's two rounds as one call (balance, sim-model,
    # sim-model, balance: the order's drift cancels), then 3b-16k's third round
    "s34-a": [(130, PY + [B + "stream_ab.py", "--case", "1b-16k", "--variants", v,
                          "--skip-tests", "--steps", "8", "--tag", tag])
              for v, tag in (("balance,sim-model", "s34a"), ("sim-model,balance", "s34b"))]
             + [(290, PY + [B + "stream_ab.py", "--variants", "balance,sim-model",
                            "--skip-tests", "--steps", "8", "--tag", "s34d"])],
    # nvidia-h200 (session 34): the bf16 TN shapes whose last panel is new, in column
    # strips packed by a host thread (the default then), in column strips copied as they
    # lie (--no-pack) and in row strips (--col-strips none), two rounds in opposite orders,
    # after the gemm GPU tests that cover the new path and its neighbours. Ran at ad2875d;
    # the column strips, both flags and their test were removed after it (59-62 ms against
    # 52: bench/NOTES.md, session 34), so the step no longer runs as written
    "s34-tn": [(120, PY + ["-m", "pytest", "-p", "no:warnings",
                           "tests/gemm/test_gemm_gpu.py", "-k",
                           "column_strips or a_rows or matches_float64 or transposes"])] + [
        (70, PY + [B + "gemm.py", "--cases", TN_NEW_PANEL, "--runs", "5"] + flags
         + ["--out", f"gemm-h200-s34-{tag}-{i}"])
        for i, order in ((1, ("pack", "nopack", "rows")), (2, ("rows", "nopack", "pack")))
        for tag, flags in ((t, {"pack": [], "nopack": ["--no-pack"],
                                "rows": ["--col-strips", "none"]}[t]) for t in order)],
    # nvidia-h200 (session 34): 3b-16k outcore alone with the allocator's segments by
    # stream at the end (bench/stream.py memory_by_stream): where the ~3 GB between the
    # reserved peak (15.5 GB) and the allocated one (12.4) sit
    "s34-mem": [(240, record("3b-16k", "stream-h200-s34-mem", 220, "--systems", "outcore"))],
    # nvidia-h200 (session 34): rest's m, v from the compute stream's pool (the default
    # now) against the h2d stream's: the stream GPU tests of device updates first, then
    # 3b-16k outcore alone, 8 measured steps, two rounds in opposite orders
    "s34-pool": [(120, PY + ["-m", "pytest", "-p", "no:warnings",
                             "tests/stream/test_gpu.py", "-k",
                             "compute_streams_pool or running_behind or budget_is_kept"])] + [
        (230, PY + [B + "stream_ab.py", "--variants", v, "--skip-tests", "--steps", "8",
                    "--tag", tag])
        for v, tag in (("balance,mv-h2d", "s34e"), ("mv-h2d,balance", "s34f"))],
    # nvidia-h200 (written in session 34, for the next): the stream GPU tests in full at
    # HEAD, then 3b-16k with its peers for the record
    "s35-check": [(240, PY + ["-m", "pytest", "-p", "no:warnings",
                              "tests/stream/test_gpu.py"]),
                  (330, record("3b-16k", "stream-h200-s35-3b16k", 150))],
    # nvidia-h200 (session 35): the record's other parts at HEAD, each with its peers:
    # 1b-16k (its part is session 17's; session 34's A/B rounds ran 0.263-0.277 s against
    # that part's 0.251), then 3b-64k (session 17's part with peers; outcore alone 419
    # TFLOP/s in session 32)
    "s35-parts": [(170, record("1b-16k", "stream-h200-s35-1b", 120)),
                  (400, record("3b-64k", "stream-h200-s35-64k", 200))],
    # then 1b-16k's FSDP2 row (s35-parts' command ran out of time in it: its first step
    # took 25 s on that machine) and the largest row at HEAD (session 32's part)
    "s35-largest": [(150, record("1b-16k", "stream-h200-s35-1b-fsdp2", 120, "--systems",
                                 "fsdp2")),
                    (300, PY + [B + "stream.py", "--cases", "", "--skip-tests", "--timeout",
                                "140", "--out", "stream-h200-s35-largest"])],
    # nvidia-h200 (session 35): 7b-16k's outcore and PyTorch rows at HEAD in the device
    # time left (FSDP2's ~220 s did not fit; the record keeps session 17's)
    "s35-7b": [(330, record("7b-16k", "stream-h200-s35-7b", 170, "--systems",
                            "outcore,pytorch"))],
    # nvidia-h200 (session 35): the CPU AdamW pass over the weights as halves (bf16 and a
    # 16-bit remainder: 26 B/param of host memory against the one pass's 28-30) alone and
    # beside copies both ways, bf16 gradients as the engine lands them
    "s35-halves": [(170, PY + [B + "adamw_cast.py", "--copies", "--bf16-grad", "--out",
                               "adamw-cast-h200-s35"])],
    # nvidia-h200 (written in session 35, for the next): the AdamW pass's non-temporal
    # stores (variant nt) at 3b-16k, outcore alone, 8 measured steps, two rounds in
    # opposite orders: with bf16 gradients (the engine's) they ran the pass 11% faster
    # beside copies both ways (adamw-cast-h200-s35.json), where session 32's fp32
    # gradients had them level; session 32 ran one round at 3b-16k (0.878 s against 0.877)
    "s36-nt": [(280, PY + [B + "stream_ab.py", "--variants", v, "--skip-tests", "--steps",
                           "8", "--tag", tag])
               for v, tag in (("balance,nt", "s36a"), ("nt,balance", "s36b"))],
    # then at 7b-16k, where the CPU AdamW bounds the step (0.95 s of optimizer wait in
    # session 35's row): the stores' 11% should show there if anywhere
    # (one file per variant and tag: the second round has its own tag)
    "s36-nt7b": [(290, PY + [B + "stream_ab.py", "--case", "7b-16k", "--variants", v,
                             "--skip-tests", "--steps", "5", "--tag", tag])
                 for v, tag in (("balance,nt", "s36c"), ("nt,balance", "s36d"))],
    # nvidia-h200 (session 36): s36-nt's rounds split by the planner's pick, not by the
    # stores (nt 0.868 s against 0.886 at 1.44B device params, 0.897 against 0.901 at
    # 1.56B): the stores on one fixed plan, rest and 10 blocks (session 35's pick was rest
    # and 9), two rounds in opposite orders
    "s36-nt10": [(185, PY + [B + "stream_ab.py", "--variants", v, "--skip-tests", "--steps",
                             "8", "--tag", tag])
                 for v, tag in (("fixed-10,nt-10", "s36e"), ("nt-10,fixed-10", "s36f"))],
    # nvidia-h200 (session 36): 7b-16k's FSDP2 row at HEAD (the record's is session 18's)
    "s36-fsdp7b": [(330, record("7b-16k", "stream-h200-s36-7b-fsdp2", 300, "--systems",
                                "fsdp2"))],
    # nvidia-h200 (session 36): both GPU test modules at HEAD (the stream ones last ran at
    # 55d6154, before cast_kernel's shared coef/with_grad; the gemm ones in session 29)
    "s36-tests": [(230, PY + ["-m", "pytest", "-rs", "--durations=5",
                              "tests/stream/test_gpu.py"]),
                  (170, PY + ["-m", "pytest", "-rs", "--durations=5",
                              "tests/gemm/test_gemm_gpu.py"])],
    # nvidia-h200 (session 37): the user's commands on the GPU at HEAD (the demo, train 1b,
    # SIGKILL then --resume, plan, gemm, embed, bad input); `outcore train` last ran on a
    # GPU in session 6
    "s37-cli": [(560, PY + [B + "cli_gpu.py", "--out", "cli-h200"])],
    # nvidia-h200 (session 37): `outcore gemm` after its warm-up fix, the swap and embed GPU
    # tests (last run in session 29), then the whole suite with the GPU visible, but for
    # the stream and gemm GPU modules (run at 425b2ca in s36-tests; their code is the same)
    "s37-check": [(90, PY + [B + "cli_gpu.py", "--only", "plan-gemm", "--out", "cli-h200-gemm"]),
                  (120, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/swap/test_swap_cuda.py", "tests/embed/test_fused.py"]),
                  (360, PY + ["-m", "pytest", "-rs", "-p", "no:warnings", "--durations=10",
                              "tests", "--ignore=tests/stream/test_gpu.py",
                              "--ignore=tests/gemm/test_gemm_gpu.py"])],
    # nvidia-h200 (session 37): s37-check's suite ran out of its 360 s at ~90% with 6
    # failures (parallel.py --smoke on CUDA ranks; a fake engine asked for CUDA streams):
    # the suite again after their fix, over 6 processes
    "s37-suite": [(540, PY + ["-m", "pytest", "-rs", "-p", "no:warnings", "-n", "6",
                              "--durations=15", "tests", "--ignore=tests/stream/test_gpu.py",
                              "--ignore=tests/gemm/test_gemm_gpu.py"])],
    # nvidia-h200 (session 38): `outcore plan`'s step (the engine's step model on measured
    # rates, plan_step.py) against measured steps; then `outcore gemm`'s 4-product default
    "s38-plan": [(470, PY + [B + "plan_gpu.py", "--cases",
                             "3b-16k,train-1b,1b-16k,7b-16k,3b-64k",
                             "--measure", "3b-16k,train-1b,1b-16k"]),
                 (90, PY + [B + "cli_gpu.py", "--only", "plan-gemm", "--out", "cli-h200-s38"])],
    # nvidia-h200 (session 38): s38-plan's CPU AdamW calibration ran in the host's L3 (8-16 G
    # params/s against the engine's 4.3-4.8): the plans again on 1 GiB of AdamW state, the
    # two bench cases s38-plan did not run measured
    "s38-plan2": [(540, PY + [B + "plan_gpu.py", "--cases",
                              "3b-16k,train-1b,1b-16k,7b-16k,3b-64k",
                              "--measure", "7b-16k,3b-64k"])],
    # nvidia-h200 (session 38): 7b-16k's measured step, which s38-plan2's 150 s per run cut
    "s38-plan7b": [(450, PY + [B + "plan_gpu.py", "--cases", "7b-16k", "--measure", "7b-16k",
                               "--out", "plan-h200-7b"])],
    # nvidia-h200 (session 38): the plans after ab51a55 (the AdamW's rate a median of 5),
    # each case planned and measured in one call but 7b-16k (s38-plan7b)
    "s38-plan3": [(560, PY + [B + "plan_gpu.py", "--cases",
                              "3b-16k,train-1b,1b-16k,3b-64k,7b-16k",
                              "--measure", "3b-16k,train-1b,1b-16k,3b-64k",
                              "--out", "plan-h200-s38c"])],
    # nvidia-h200 (session 39): `outcore train --model 1b`'s defaults planned and run with
    # their per-step time split (metrics.jsonl), with and without clipping
    "s39-plan": [(420, PY + [B + "plan_gpu.py", "--cases", "train-1b,train-1b-noclip",
                             "--measure", "train-1b,train-1b-noclip",
                             "--out", "plan-h200-s39a"])],
    # nvidia-h200 (session 39): the trainer's clipped steps with held GPU updates (auto)
    # against the default (all AdamW on the CPU), at 1b and 3b, planned and run
    "s39-held": [(580, PY + [B + "plan_gpu.py", "--cases",
                             "train-1b,train-1b-held,train-3b,train-3b-held",
                             "--measure", "train-1b,train-1b-held,train-3b,train-3b-held",
                             "--out", "plan-h200-s39b"])],
    # nvidia-h200 (session 39): the GPU tests of what this session's reviews changed (the
    # engine's set-up and checkpoints, swap's version checks on the d2h stream), then
    # `outcore train --model 1b` planned (held model with the gradients' copies out, host
    # copies as train decides) and run
    "s39-check": [(200, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "--durations=5", "tests/stream/test_gpu.py"]),
                  (90, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                             "tests/swap/test_swap_cuda.py"]),
                  (140, PY + [B + "plan_gpu.py", "--cases", "train-1b", "--measure",
                              "train-1b", "--out", "plan-h200-s39c"])],
    # nvidia-h200 (session 39): the held model since b375b3d against a run, at 1b
    "s39-held1b": [(200, PY + [B + "plan_gpu.py", "--cases", "train-1b-held", "--measure",
                               "train-1b-held", "--out", "plan-h200-s39d"])],
    # nvidia-h200 (session 40): the GPU tests of session 39's changes not yet run on a GPU
    # (BatchNorm's recompute into copies, .model's buffers, the stash's clear and check,
    # swap's Saved wrapper), then the swap bench at HEAD against the README's figures
    "s40-check": [(200, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "--durations=5", "tests/stream/test_gpu.py"]),
                  (90, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                             "tests/swap/test_swap_cuda.py"]),
                  (280, PY + [B + "swap.py", "--budget-s", "240", "--out", "swap-h200-s40"])],
    # nvidia-h200 (session 40): 3b-16k with its peers at HEAD, after session 39's and 40's
    # engine changes (BatchNorm copies, the stash's clear, shared_args, rebound params)
    "s40-3b16k": [(570, record("3b-16k", "stream-h200-s40-3b16k", 185))],
    # nvidia-h200 (session 40): after session 40's reviews (gemm.Linear, embed's reader
    # and eval, plan/config/resume, swap's state_dict): the GPU tests they touch, the
    # user's commands on the GPU, and embed's GPU check and quality case (no PBG)
    "s40-final": [(100, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/embed/test_fused.py", "tests/swap/test_swap_cuda.py",
                              "tests/gemm/test_gemm_gpu.py", "-k",
                              "linear or fused or swap or cuda"]),
                  (250, PY + [B + "cli_gpu.py", "--out", "cli-h200-s40"]),
                  (170, PY + [B + "embed.py", "--cases", "check,quality", "--skip-pbg",
                              "--budget-s", "140", "--out", "embed-h200-s40"])],
    # nvidia-h200 (session 40): shared_args and p.data rebound through .model on CUDA
    # (fp32) against plain PyTorch
    "s40-args": [(90, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                            "tests/stream/test_engine_args.py"])],
    # nvidia-h200 (session 41): session 40's engine changes on CUDA (shared_args, params
    # rebound through .model, fp32 against plain PyTorch), then the stream GPU tests at HEAD
    "s41-check": [(90, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                             "tests/stream/test_engine_args.py"]),
                  (220, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "--durations=5", "tests/stream/test_gpu.py"])],
    # nvidia-h200 (session 41): the record's 3b-64k (outcore and PyTorch; FSDP2 is no
    # target there) and largest rows at HEAD: the record's are session 35's engine
    "s41-verify": [(260, record("3b-64k", "stream-h200-s41-64k", 200, "--systems",
                                "outcore,pytorch")),
                   (220, PY + [B + "stream.py", "--cases", "", "--skip-tests", "--timeout",
                               "180", "--out", "stream-h200-s41-largest"])],
    # nvidia-h200 (session 41): after session 41's changes (DecoderConfig's and Decoder's
    # checks, parallel's agreement on non-finite groups and batches, checkpoints' directory
    # fsync): the stream GPU tests and the user's commands on the GPU
    "s41-final": [(220, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/stream/test_gpu.py"]),
                  (280, PY + [B + "cli_gpu.py", "--out", "cli-h200-s41"])],
    # nvidia-h200 (session 42): s41-final's commands at HEAD, after session 42's changes
    # (CLI errors in flag spelling, the HF loader's file and tensor matching, new CSV columns)
    "s42-final": [(220, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/stream/test_gpu.py"]),
                  (280, PY + [B + "cli_gpu.py", "--out", "cli-h200-s42"])],
    # nvidia-h200 (session 42): 3b-16k with its peers at HEAD (the FSDP2 margin: 2.29x in
    # the record, 2.19x in session 40)
    "s42-3b16k": [(570, record("3b-16k", "stream-h200-s42-3b16k", 185))],
    # nvidia-h200 (session 42): after the reviews of swap, embed training and gemm.matmul's
    # entry: swap's CUDA tests and embed's fused kernel, embed's GPU check and quality case
    # (the planner's workspace grew), the gemm GPU tests
    "s42-reviews": [(100, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                                "tests/swap/test_swap_cuda.py", "tests/embed/test_fused.py"]),
                    (170, PY + [B + "embed.py", "--cases", "check,quality", "--skip-pbg",
                                "--budget-s", "140", "--out", "embed-h200-s42"]),
                    (160, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                                "tests/gemm/test_gemm_gpu.py"])],
    # nvidia-h200 (written in session 46, for the next): the stream GPU tests (session 46
    # gave them 130 s, too little: 18 had passed) and the GPU demo at HEAD, then 7b-16k
    # outcore alone with room for its setup (194 s in all in session 46 with the eager
    # build of that time; each run's log now gives its model's and engine's build times)
    "s47-check": [(240, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/stream/test_gpu.py", "tests/stream/test_engine_args.py"]),
                  (100, PY + [B + "cli_gpu.py", "--only", "demo", "--out", "cli-h200-s47"]),
                  (250, record("7b-16k", "stream-h200-s47-7b", 240, "--systems", "outcore"))],
    # nvidia-h200 (session 47): s47-check without its 7b run (each A/B call below runs HEAD
    # at 7b-16k twice), so that the A/B's two calls fit the device time left after it
    "s47-tests": [(260, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/stream/test_gpu.py", "tests/stream/test_engine_args.py"]),
                  (100, PY + [B + "cli_gpu.py", "--only", "demo", "--out", "cli-h200-s47"])],
    # nvidia-h200 (written in session 47, for the next): swap's CUDA tests with the
    # interrupted-forward tests, then the whole swap bench at HEAD (session 47's check of an
    # interrupted forward walks a few frames per saved tensor) against session 45's record
    "s47-swap": [(120, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                             "tests/swap/test_swap_cuda.py", "tests/swap/test_swap_unhooked.py"]),
                 (280, PY + [B + "swap.py", "--budget-s", "240", "--out", "swap-h200-s47"])],
    # nvidia-h200 (written in session 49): s47-swap's two commands, then `outcore plan
    # --model 7b` and `outcore gemm` (bench/cli_gpu.py): session 47's plan_step builds the
    # timed block on the meta device and allocates it in the compute dtype, not yet run on
    # a GPU
    "s49-check": [(120, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/swap/test_swap_cuda.py", "tests/swap/test_swap_unhooked.py"]),
                  (280, PY + [B + "swap.py", "--budget-s", "240", "--out", "swap-h200-s49"]),
                  (120, PY + [B + "cli_gpu.py", "--only", "plan-gemm", "--out", "cli-h200-s49"])],
    # nvidia-h200 (session 49): the GPU tests of what session 49 moved (gemm's GemmPlan
    # into planned.py, strassen's Quad and Finisher, stream's device_choice.py), and
    # `outcore plan --model 7b` without torch's cuBLAS context warning
    "s49-final": [(150, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/gemm/test_gemm_gpu.py", "tests/gemm/test_gemm_plan.py",
                              "tests/gemm/test_gemm_strassen.py"]),
                  (260, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/stream/test_gpu.py", "tests/stream/test_engine_args.py"]),
                  (120, PY + [B + "cli_gpu.py", "--only", "plan-gemm", "--out",
                              "cli-h200-s49b"])],
    # nvidia-h200 (session 49): the swap bench under PYTORCH_CUDA_ALLOC_CONF=
    # expandable_segments:True for every system (s49-check's wide_resnet101_2 max batch was
    # 182 where session 45's was 227: the allocator's segments at the cap?), then swap's
    # CUDA tests
    "s49-swapx": [(280, PY + [B + "swap.py", "--budget-s", "240", "--alloc-conf",
                              "expandable_segments:True", "--out", "swap-h200-s49-expandable"]),
                  (120, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                              "tests/swap/test_swap_cuda.py"])],
    # nvidia-h200 (session 49): swap's expandable segments by default (swap/allocator.py):
    # the CUDA tests with its own, then the swap bench at torch's default allocator settings
    # (outcore's rows now under expandable segments, the peers' not)
    "s49-segments": [(120, PY + ["-m", "pytest", "-rs", "-p", "no:warnings",
                                 "tests/swap/test_swap_cuda.py",
                                 "tests/swap/test_swap_allocator.py"]),
                     (280, PY + [B + "swap.py", "--budget-s", "240", "--out",
                                 "swap-h200-s49-segments"])],
    # the 7b-16k A/B of session 45's question, HEAD against 5091731 (session 35's engine of
    # record) in old/ (untar it first, in the same command), over two calls: ABBA needs
    # about 800 s. Each run's limit leaves room for the old tree's slower build.
    "s47-7b-a": [(580, PY + [B + "tree_ab.py", "--case", "7b-16k", "--old-dir", "old",
                             "--old-commit", "5091731", "--tag", "s47-7b", "--order",
                             "old1,new1", "--timeout", "250", "--steps", "5", "--out-dir",
                             "bench/results"])],
    "s47-7b-b": [(580, PY + [B + "tree_ab.py", "--case", "7b-16k", "--old-dir", "old",
                             "--old-commit", "5091731", "--tag", "s47-7b", "--order",
                             "new2,old2", "--timeout", "250", "--steps", "5", "--out-dir",
                             "bench/results"])],
    # nvidia-h200 (written in session 25): tf32x3's error on Gram matrices by BIG_CHUNK
    "s26-gram": [(120, PY + [B + "diag/x3_gram.py"])],
    # nvidia-h200 (session 22): 3b-16k outcore alone, 8 measured steps each: the balance
    # planner on the last CPU rate it measured (the default), on the best (the planner then
    # adds no group after its first move in the replayed runs of sessions 8-12), and rest +
    # 10 blocks fixed (the count of the fastest runs); then the same in the reverse order
    "s22-rate": [(560, PY + [B + "stream_ab.py", "--variants", "balance,best-rate,fixed-10",
                             "--skip-tests", "--steps", "8", "--tag", "s22a"])],
    "s22-rate2": [(560, PY + [B + "stream_ab.py", "--variants", "fixed-10,best-rate,balance",
                              "--skip-tests", "--steps", "8", "--tag", "s22b"])],
    # nvidia-h200 (session 22): fp32-16384's head: 4096-deep pieces (16 KiB rows of A) and
    # pieces growing from 512 deep, in the planner's tiles, 8192^2 and 4096-row strips;
    # then whole-height strips for the fp32 TN shapes (lone.TALL_TA with fp32)
    "s22-head": [(200, ["env", "FP32_TILES=planner-piece4096,planner-ramp512,"
                        "planner-piece4096-ramp512,8192-ramp512,8192-piece4096-ramp512,"
                        "wide-4096-ramp512,8192-first1024"] + PY + [B + "diag/fp32_tiles.py"]),
                 (200, ["env", "FP32_WIDE=tall", "FP32_CASES=-TN-"]
                  + PY + [B + "diag/fp32_wide.py"])],
    # nvidia-h200 (session 22): where a product's host time before its first copy goes
    "s22-host": [(120, PY + [B + "diag/host_setup.py"])],
    # nvidia-h200 (session 22, after the allocator's counts are read once a product): the
    # host's time again, the gemm GPU tests, then the bf16 shapes at 16384 tokens (18-19 ms
    # products) and fp32-16384, 5 runs each, against the record's
    "s22-host2": [(120, ["env", "HOST_SETUP_TAG=s22b"] + PY + [B + "diag/host_setup.py"]),
                  (150, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                  (200, PY + [B + "gemm.py", "--cases", "fp32-16384," + ",".join(
                      f"train-{lay}-t16384-f{f}-bf16" for f in (8192, 16384)
                      for lay in ("NT", "NN", "TN")), "--runs", "5", "--out",
                      "gemm-h200-s22-host"])],
    # nvidia-h200 (session 22): s22-host2's bench cases again (its NN bf16 case at 8192
    # features ran 29-32 ms against the record's 18-19), twice
    "s22-host3": [(150, PY + [B + "gemm.py", "--cases", "fp32-16384," + ",".join(
        f"train-{lay}-t16384-f{f}-bf16" for f in (8192, 16384)
        for lay in ("NT", "NN", "TN")), "--runs", "5", "--out", f"gemm-h200-s22-host{i}"])
        for i in (2, 3)],
    # nvidia-h200 (session 22, after s22-cache): the gemm run of record at HEAD
    "s22-record": [(420, PY + [B + "gemm.py", "--budget-s", "330"])],
    # nvidia-h200 (session 22, after a plan that caches every block stopped evicting when a
    # strip needs a block of its own rows): the gemm GPU tests, then the two square cases
    # whose plans that touches (bf16-32768: one block more than its slots) or not
    # (fp32-16384), 5 runs each, against the record's
    "s22-cache": [(150, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                  (200, PY + [B + "gemm.py", "--cases", "fp32-16384,bf16-32768", "--no-train",
                              "--runs", "5", "--out", "gemm-h200-s22-cache"])],
    # nvidia-h200 (session 21): the gemm GPU tests with fp32 GEMMs through cuBLASLt's
    # configured kernel (outcore.gemm.ltmm), then the whole gemm bench (the run of record)
    "s21-record": [(120, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                   (420, PY + [B + "gemm.py", "--budget-s", "330"])],
    # nvidia-h200 (session 21): with fp32 GEMMs through ltmm, the configured kernel's rate
    # on other tile shapes, fp32-16384 in other tiles, and fp32-16384 against cuBLASXt with
    # 7 runs each (how far cuBLASXt's figure moves)
    "s21-tiles": [(150, ["env", "LT_SWEEP=4096x16384x2048,2048x16384x2048,8192x8192x2048,"
                         "16384x4096x2048,1024x4096x16384,4096x4096x1024,8192x8192x16384"]
                   + PY + [B + "diag/lt_algos.py"]),
                  (150, ["env", "FP32_TILES=tall-4096,8192,wide-2048,wide-4096,wide-8192,"
                         "planner-first1024"] + PY + [B + "diag/fp32_tiles.py"]),
                  (150, PY + [B + "gemm.py", "--cases", "fp32-16384", "--no-train", "--runs",
                              "7", "--out", "gemm-h200-s21-16k"])],
    # nvidia-h200 (session 21): where fp32-16384's 171 ms go with ltmm's kernels: the probe's
    # kernels (through mmacc), its fp32-16384 variants and the planner's product traced
    "s21-probe": [(300, PY + [B + "gemm_probe.py", "--only", "fp32-16384", "--out",
                              "gemm-probe-h200-s21"])],
    # nvidia-h200 (session 21): fp32 plans in few wide tiles (lone.FEW_WIDE), with and
    # without a 1024-deep first piece, against the default, now on ltmm's kernels
    "s21-wide": [(300, PY + [B + "diag/fp32_wide.py"])],
    # nvidia-h200 (session 21): the gemm GPU tests (the stats count ltmm's GEMMs), then
    # cuBLASLt's configurations for the NT products' GEMMs (B column-contiguous)
    "s21-nt": [(120, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
               (200, ["env", "LT_SWEEP=4096x4096x8192t,4096x4096x16384t,4096x4096x2048t,"
                      "8192x8192x16384t,8192x8192x2048t", "LT_TAG=nt"]
                + PY + [B + "diag/lt_algos.py"])],
    # nvidia-h200 (session 21): the gemm GPU tests, then every fp32 bench case with
    # outcore.gemm.ltmm on and off
    "s21-lt": [(120, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
               (440, PY + [B + "diag/lt_ab.py"])],
    # nvidia-h200 (session 20, after the cache took each block at its own size): the gemm
    # GPU tests, then the new picks against the old ones (tf32-32768; bf16-32768 under
    # 16 and 8 GiB)
    "s20-exact": [(90, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                  (200, PY + [B + "diag/exact_cache.py"])],
    # nvidia-h200 (session 20): the stream GPU tests and 3b-16k every system at HEAD (stream
    # untouched since session 18's record: a fresh sample of the missed 1.0x)
    "s20-16k": [(570, PY + [B + "stream.py", "--cases", "3b-16k", "--compiled", "--largest",
                            "0", "--timeout", "200", "--out", "stream-h200-s20-16k"])],
    # nvidia-h200 (session 20, after s20-short made the 512-row strips a default): the gemm
    # GPU tests, then the run of record
    "s20-record": [(90, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                   (330, PY + [B + "gemm.py", "--budget-s", "300"])],
    # nvidia-h200 (session 20): 512-row whole-width strips where M <= 16384
    # (lone.SHORT_STRIP_MAX_M, the four bf16 shapes at 16384 tokens) against none, three
    # pairs, the order alternating
    "s20-short": [(90, PY + [B + "gemm.py", "--cases", SHORT_CASES, "--runs", "5", "--out",
                              f"gemm-h200-s20-short{tag}-{i}", "--short-strip-max-m",
                              "16384" if tag == "on" else "0"])
                  for i, pair in ((1, ("on", "off")), (2, ("off", "on")), (3, ("on", "off")))
                  for tag in pair],
    # nvidia-h200 (session 19, the last call): the two square cases whose targets sit in
    # the runs' spread, at HEAD's defaults, 7 runs each, twice (not the record: a sample
    # of the spread)
    "s19-square": [(100, PY + [B + "gemm.py", "--cases", "fp32-16384,bf16-32768", "--runs", "7",
                               "--out", f"gemm-h200-s19-square-{i}"]) for i in (1, 2)],
    # nvidia-h200 (session 19, after s19-sides made 1024-row strips the default): 512-row
    # strips too (the model then takes them in 12 bf16 training shapes, 1-3% faster by its
    # count) against the default, every bf16 case, twice, alternating
    "s19-sides512": [(150, PY + [B + "gemm.py", "--cases", BF16_CASES, "--runs", "5", "--out",
                                 f"gemm-h200-s19b-{tag}-{i}"] + SIDE_VARIANTS[tag])
                     for i, pair in ((1, ("side512", "side1024")), (2, ("side1024", "side512")))
                     for tag in pair],
    # nvidia-h200 (session 19): fp32-16384 in forced tiles (whole-height strips, 8192^2,
    # shallow first pieces) against the planner's 4096^2
    "s19-fp32": [(120, PY + [B + "diag/fp32_tiles.py"])],
    # nvidia-h200 (session 19): flat tiles and whole-width strips 1024 rows tall too
    # (lone.FLAT_SIDES and STRIP_ROWS; the model then takes 1024-row strips in 15 of the
    # 19 bf16 cases) against 2048 and up, on every bf16 case, twice, alternating
    "s19-sides": [(150, PY + [B + "gemm.py", "--cases", BF16_CASES, "--runs", "5", "--out",
                              f"gemm-h200-s19-{tag}-{i}"] + SIDE_VARIANTS[tag])
                  for i, pair in ((1, ("side1024", "side2048")), (2, ("side2048", "side1024")))
                  for tag in pair],
    # nvidia-h200 (session 19): the gemm GPU tests and the run of record at the model with
    # D2H_ROW_FACTOR as s19-d2h2's "mid" (the five NT shapes in 8192-wide tiles)
    "s19-record": [(90, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                   (330, PY + [B + "gemm.py", "--budget-s", "300"])],
    # nvidia-h200 (session 19, after s19-d2h: whole-width NT tiles 1.10-1.22x faster at
    # 16384 features, TN t32768-f16384 in one tile 0.93x): the copy rates again, with the
    # contiguous copy the other way timed too; then three models on the NT shapes at 16384
    # features and that TN shape: D2H_ROW_FACTOR as in s19-d2h ("wide": NT whole-width, TN
    # one tile), with 32 KiB rows at 0.97 ("mid": NT 8192-wide, TN two tiles), and off
    "s19-d2h2": [(90, PY + [B + "diag/copy_rows.py"])]
    + [(90, PY + [B + "gemm.py", "--cases", D2H2_CASES, "--runs", "5", "--out",
                  f"gemm-h200-s19-{tag}{i}"] + D2H_VARIANTS[tag])
       for i, tags in ((1, ("wide", "mid", "off")), (2, ("off", "mid", "wide")))
       for tag in tags],
    # nvidia-h200 (session 19): 2-D copy rates by row width, each way, alone and beside a
    # contiguous copy the other way; then the planner's model charging C tiles narrower
    # than C for their copies out (model.D2H_ROWS, the default in this tree) against the
    # model of sessions 11-18 (--d2h-rows off), on the six bf16 training shapes whose plans
    # it changes, twice, alternating ("on": the table as it was then, s19-d2h2's "wide")
    "s19-d2h": [(90, PY + [B + "diag/copy_rows.py"])]
    + [(90, PY + [B + "gemm.py", "--cases", D2H_CASES, "--runs", "5", "--d2h-rows", flag,
                  "--out", f"gemm-h200-s19-d2h{flag}{i}"]
        + (D2H_VARIANTS["wide"] if flag == "on" else []))
       for i, flags in ((1, ("on", "off")), (2, ("off", "on"))) for flag in flags],
    # nvidia-h200 (session 18): bf16 / tf32 GEMMs of whole-width strips in column chunks
    # (mmacc.COL_CHUNK), kernels and products; then the largest row at HEAD (the record's
    # is session 12's engine, b33ddcd)
    "s18-split": [(150, PY + [B + "diag/gemm_split.py"]),
                  (300, PY + [B + "stream.py", "--cases", "", "--skip-tests", "--out",
                              "stream-h200-s18-largest"])],
    # nvidia-h200 (session 18): the gemm GPU tests at HEAD (mmacc changed), the fp32 A/B of
    # few wide tiles (lone.FEW_WIDE), then the stream GPU tests at HEAD
    "s18-final": [(120, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                  (260, PY + [B + "diag/fp32_wide.py"]),
                  (200, PY + ["-m", "pytest", "tests/stream/test_gpu.py"])],
    # nvidia-h200 (session 18): B by rows for K >= 16384 (lone.B_ROWS_MIN_K, the default
    # since 18): the gemm GPU tests, the bf16 NT shapes with it and without (--b-rows
    # none), twice, alternating; then the gemm run of record at the new default
    "s18-brows": [(90, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"])]
    + [(75, PY + [B + "gemm.py", "--cases", NT_CASES, "--runs", "5", "--out",
                  f"gemm-h200-s18-{tag}{i}"] + flag)
       for i in (1, 2) for tag, flag in (("brows", []), ("nobrows", ["--b-rows", "none"]))]
    + [(330, PY + [B + "gemm.py", "--budget-s", "300"])],
    # nvidia-h200 (session 18): whole-height strips for a transposed A (lone.TALL_TA, the
    # default since 18): the gemm GPU tests, the bf16 TN shapes with them and without
    # (--tall-ta none), twice, alternating; then the gemm run of record at the new default
    "s18-tall": [(90, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"])]
    + [(75, PY + [B + "gemm.py", "--cases", TN_CASES, "--runs", "5", "--out",
                  f"gemm-h200-s18-{tag}{i}"] + flag)
       for i in (1, 2) for tag, flag in (("tall", []), ("notall", ["--tall-ta", "none"]))]
    + [(330, PY + [B + "gemm.py", "--budget-s", "300", "--out", "gemm-h200-s18-tallrec"])],
    # nvidia-h200 (session 18): the gemm GPU tests and the run of record at the final
    # defaults (whole-height strips for a transposed A where M >= 16384)
    "s18-record": [(90, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                   (330, PY + [B + "gemm.py", "--budget-s", "300"])],
    # nvidia-h200 (session 16): the gemm GPU tests (B by rows among them), then the bf16 NT
    # training shapes with a transposed B's panels by rows (the default then, b070255) and
    # without (B by rows became opt-in after it: slower at K = N = 8192)
    "brows-ab": [(120, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                 (120, PY + [B + "gemm.py", "--cases", NT_CASES, "--runs", "5", "--out",
                             "gemm-h200-s16-brows"]),
                 (120, PY + [B + "gemm.py", "--b-rows", "none", "--cases", NT_CASES,
                             "--runs", "5", "--out", "gemm-h200-s16-nobrows"]),
                 # the whole bench at B by rows too (the run of record if the A/B holds)
                 (300, PY + [B + "gemm.py", "--budget-s", "240", "--out",
                             "gemm-h200-s16-record2"])],
    # nvidia-h200 (session 16): 4 accumulators against 2 (plan.LONE_ACCS) at bf16-32768
    # and fp32-16384, three alternations (the spread between runs is larger than the gain
    # looked for: the 3.4 ms the compute stream idled behind C's copies out)
    "accs-ab": accs_pairs(range(3), alternate=False),
    # nvidia-h200 (session 16, after accs-ab: 4 accumulators won all three pairs by 0.4-1.7
    # ms, inside one run's spread): four more pairs, each pair's order alternating
    "accs-ab2": accs_pairs(range(3, 7), alternate=True),
    # nvidia-h200 (session 16, the last call): the gemm GPU tests, then the whole bench at
    # 4 accumulators (the new default) under a 150 s budget: the run of record
    "s16-record3": [(60, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py"]),
                    (200, PY + [B + "gemm.py", "--budget-s", "150"])],
    "arows-probe": [(90, PY + ["-m", "pytest", "tests/gemm/test_gemm_gpu.py", "-k",
                               "a_rows"]),
                    (150, PY + [B + "gemm_probe.py", "--first", "1", "--no-kernels", "--out",
                                "gemm-probe-h200-s16"])],
    # nvidia-h200: the in-core rates of the tiles' GEMM shapes, then plan variants (flat
    # tiles in tf32/bf16, larger tiles at fp32-16384) and a timeline of each planner pick
    "gemm-probe": [(300, PY + [B + "gemm_probe.py"])],
    # nvidia-h200: the probe at session 11's planner (merged fresh pieces, the last tile in
    # strips, flat tiles by default), then the whole gemm bench as the run of record
    "gemm-record": [(150, PY + [B + "gemm_probe.py"]),
                    (420, PY + [B + "gemm.py", "--budget-s", "330"])],
    # nvidia-h200: the gemm GPU tests at session 11's worker (merged pieces, strips), why
    # the bench's tf32/bf16 rows run slower than the probe's, and 3b-64k with the default
    # since session 10 (host_weight_copy="auto") appended to the run of record
    "s11-final": [(140, PY + ["-m", "pytest", "-x", "tests/gemm/test_gemm_gpu.py"]),
                  (90, PY + [B + "diag/gemm_order.py"]),
                  (330, PY + [B + "stream.py", "--cases", "3b-64k", "--compiled", "--largest",
                              "0", "--skip-tests", "--append", "--timeout", "170"])],
    # nvidia-h200: do two tile GEMMs on two streams beat one after the other (gemm's
    # compute-bound cases)? Then the largest row with the default
    "s12-a": [(120, PY + [B + "diag/gemm_streams.py"]),
              (330, PY + [B + "stream.py", "--cases", "", "--skip-tests", "--out",
                          "stream-h200-s12-largest"])],
    # nvidia-h200: 7b-16k with all three systems (the record's row is session 8's, and its
    # FSDP2 ran past 170 s)
    "s12-7b": [(560, PY + [B + "stream.py", "--cases", "7b-16k", "--compiled", "--largest",
                           "0", "--skip-tests", "--timeout", "260", "--out",
                           "stream-h200-s12-7b"])],
    # nvidia-h200 (session 13's plan): the stream GPU tests (Engine(block_slots) has never
    # run on a GPU), then outcore alone at 3b-16k: the default, 4 slots in the interleaved
    # order (stream/simulate.py: about 0.80 s against 0.85), the same planned by the
    # simulation
    "slots-ab": [(580, PY + [B + "stream_ab.py", "--variants", "balance,slots4-i,slots4-i-sim",
                             "--tag", "slots"])],
    # 4 slots in the default order, the planner's CPU rate, the fixed count of the fastest
    # runs, the simulated model
    "rate-ab": [(500, PY + [B + "stream_ab.py", "--variants",
                            "slots4,best-rate,fixed-10,sim-model", "--skip-tests", "--tag",
                            "rate"])],
    # nvidia-h200: the gemm bench under a time budget
    "gemm-bench": [(260, PY + [B + "gemm.py", "--budget-s", "150", "--out",
                               "gemm-h200-next"])],
    # nvidia-h200-x2: the two-GPU gemm rows (the record's are session 2's code), then the
    # gemm GPU tests with both GPUs visible
    # session 29 on nvidia-h200-x2: the two-GPU rows with a wider median (session 14's
    # rest on one run), strassen on two GPUs beside them, then the GPU tests (two-GPU ones)
    "s29-x2": [(420, PY + [B + "gemm.py", "--runs", "5", "--budget-s", "360"]),
               (170, PY + ["-m", "pytest", "-x", "-p", "no:warnings",
                           "tests/gemm/test_gemm_gpu.py"])],
    "gemm-x2": [(300, PY + [B + "gemm.py", "--budget-s", "200"]),
                (200, PY + ["-m", "pytest", "-x", "tests/gemm/test_gemm_gpu.py"])],
    # nvidia-h200-x2: issue 5's largest rows (merged into parallel-h200x2.json by
    # bench/merge_parts.py afterwards, on the CPU), the embedding throughput
    # (models built lazily since session 10: about 15B and 14B params on its 256 GiB)
    "x2": [(590, PY + [B + "parallel.py", "--cases", "largest-1gpu,largest-2gpu",
                       "--case-limit", "290", "--out", "parallel-h200x2-largest"])],
}


def with_stream_flags(steps: dict, flags: list[str]) -> dict:
    """`steps` with `flags` added to every bench/stream.py command (e.g. --no-keep-weights
    for a run of record without keep.py)."""
    if not flags:
        return steps
    return {name: [(limit, cmd + flags if any(c.endswith("stream.py") for c in cmd) else cmd)
                   for limit, cmd in cmds] for name, cmds in steps.items()}


ARCHIVE = "results.tar"   # in the output dir: every results file the commands wrote


def snapshot(results: Path) -> dict[str, float]:
    """bench/results/ file -> modification time."""
    return {p.name: p.stat().st_mtime for p in results.glob("*") if p.is_file()}


def run_step(name: str, out_dir: Path, results: Path = common.RESULTS,
             steps: dict = STEPS) -> list[dict]:
    """Run step `name`'s commands in the repository root; rows for the table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (limit, cmd) in enumerate(steps[name]):
        before = snapshot(results)
        log = out_dir / f"{name}-{i}.log"
        t = time.perf_counter()
        with open(log, "w") as f:
            try:
                rc = subprocess.run(cmd, cwd=common.ROOT, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        after = snapshot(results)
        wrote = sorted(k for k, m in after.items() if before.get(k) != m)
        # What this command measured leaves the machine with the call, in one archive: the
        # device tool brings back at most 8 files (session 9 lost two results files).
        with tarfile.open(out_dir / ARCHIVE, "a") as tar:
            for k in wrote:
                tar.add(results / k, arcname=k)
        rows.append({"step": name, "command": " ".join(Path(c).name if j == 0 else c
                                                       for j, c in enumerate(cmd))[:70],
                     "rc": rc, "seconds": round(time.perf_counter() - t, 1),
                     "wrote": ", ".join(wrote) or "-", "log": log.name})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("steps", nargs="*", help=f"one or more of: {', '.join(STEPS)}")
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp/outcore-gpu-session"))
    ap.add_argument("--list", action="store_true", help="print the steps' commands")
    ap.add_argument("--stream-flags", default="", help="added to every bench/stream.py "
                    "command, e.g. \"--no-keep-weights\"")
    args = ap.parse_args()
    steps = with_stream_flags(STEPS, args.stream_flags.split())
    if args.list or not args.steps:
        for name, cmds in steps.items():
            print(f"{name}:")
            for limit, cmd in cmds:
                print(f"  [{limit} s] {' '.join(cmd[1:])}")
        return 0
    unknown = [s for s in args.steps if s not in steps]
    if unknown:
        print(f"gpu_session.py: unknown step {unknown[0]!r}: choose from {', '.join(steps)}",
              file=sys.stderr)
        return 2
    if not os.environ.get("OUTCORE_COMMIT"):
        print("gpu_session.py: set OUTCORE_COMMIT=<sha> (the GPU machine's tree has no .git)",
              file=sys.stderr)
    rows = []
    for s in args.steps:
        rows += run_step(s, Path(args.out_dir), steps=steps)
    print(common.table(rows, ["step", "command", "rc", "seconds", "wrote", "log"]))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
