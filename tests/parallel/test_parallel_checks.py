"""Two gloo ranks through the edges of the sharded engine: a rank with no label token, measured
shares read a step late, edits through engine.model, checkpoints (buffers, refusals, a
failed save), models or options that differ across ranks.

All scenarios run in ONE two-rank job (worker_checks.py; a job costs seconds of start-up),
each test reads its scenario's result. The order puts the scenarios that used to hang or
abort the job last.
"""

from pathlib import Path

import pytest
import torch

from .spawn_parallel import run_ranks

CASES = ["masked_rank", "resume_save", "measured", "edits", "buffers", "nonfinite",
         "batch_differs", "model_buffers", "bad_loads",
         "save_other_dir", "shard_fails", "save_unwritable", "mismatch"]
N = 2


WORKER = Path(__file__).with_name("worker_checks.py")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checks")
    cfg = {"cases": CASES, "tmp": str(tmp), "out": str(tmp / "res")}
    rc, errs, seconds = run_ranks(cfg, N, timeout=150, worker=WORKER)
    return {"rc": rc, "errs": errs, "seconds": seconds, "out": cfg["out"], "tmp": tmp}


def results(job, case, n=N):
    """Every rank's result of `case`, or a failure showing how the job ended."""
    outs = []
    for r in range(n):
        f = Path(f"{job['out']}.{case}.{r}")
        if not f.is_file():
            pytest.fail(f"rank {r} left no result for {case!r}: rc={job['rc']}\n" +
                        "\n".join(e[-3000:] for e in job["errs"]))
        res = torch.load(f)
        assert "raised" not in res, res.get("trace", res)
        outs.append(res)
    return outs


def one_line(msg: str, *words):
    assert not msg.startswith("NOT "), msg
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg


def test_the_job_ends_cleanly(job):
    assert job["rc"] == [0] * N, "\n".join(e[-3000:] for e in job["errs"])


def test_a_rank_whose_rows_hold_no_label_token_adds_nothing_not_nan(job):
    """0.7/0.3 of 7 rows: rank 1's 2 rows are all -100. Its Hugging Face loss is a mean
    over no tokens (NaN); its part of the batch's mean is 0: the loss must be the whole
    batch's, as in one process, and so must the weights (within fp32)."""
    for o in results(job, "masked_rank"):
        assert o["rows"] == [5, 5] or o["rows"] == [2, 2]
        for got, want in zip(o["losses"], o["want"]):
            assert abs(got - want) <= 1e-5 * abs(want), (o["losses"], o["want"])
        assert o["worst"] < 1e-4


def test_a_checkpoint_of_2_ranks_resumes_on_1_as_one_process_would(job):
    """Resuming on another number of ranks is supported (parallel/checkpoint.py): here on
    a job of ONE rank (world size 1), from 2 ranks with shares 0.7/0.3 and clipping."""
    results(job, "resume_save")
    cfg = {"cases": ["resume_one"], "tmp": str(job["tmp"]), "out": str(job["tmp"] / "one")}
    rc, errs, _ = run_ranks(cfg, 1, timeout=60, worker=WORKER)
    assert rc == [0], errs[0][-3000:]
    (o,) = results({**job, "out": cfg["out"], "rc": rc, "errs": errs}, "resume_one", n=1)
    assert o["world"] == 1 and o["step"] == 2
    assert abs(o["loss"] - o["want"]) <= 1e-5 * abs(o["want"])
    assert o["worst"] < 1e-5


def test_a_rank_that_raises_mid_step_ends_the_job_naming_it(tmp_path):
    """Rank 1's program dies of an exception in step 2 while rank 0 waits in that step's
    collectives: rank 0 must not wait forever (the watchdog names rank 1 and exits)."""
    cfg = {"cases": ["raise_mid_step"], "tmp": str(tmp_path), "out": str(tmp_path / "r"),
           "reraise": True, "heartbeat": 3}
    rc, errs, seconds = run_ranks(cfg, N, timeout=60, worker=WORKER)
    assert "killed after timeout" not in "".join(errs), errs
    assert rc[0] != 0 and rc[1] != 0, rc
    assert "a bug in rank 1's loss" in errs[1]
    assert "rank 1" in errs[0].strip().splitlines()[-1], errs[0][-2000:]
    assert seconds < 45, seconds


def test_measured_shares_follow_a_1_to_3_speed_ratio_when_timed_a_step_late(job):
    """The compute time of the step before pairs with that step's rows, not this step's:
    paired wrongly, step 3 measured 4 rows against the time of 8 and gave rank 0 2 rows
    of 16 (0.1), overshooting 1/4. Rows at the end: 4 and 12 (1:3)."""
    r0, r1 = results(job, "measured")
    rows0 = r0["rows"]
    assert rows0[0] == 8                       # equal until measured
    assert all(3 <= r <= 5 for r in rows0[2:]), rows0
    assert r1["rows"][-1] == 16 - rows0[-1]
    for shares in r0["history"]:
        assert 0 < shares[0] < 1 and abs(sum(shares) - 1) < 1e-9


def test_edits_through_engine_model_are_trained_and_saved(job):
    """As with one process: weights edited through engine.model are what the next step
    starts from (they were dropped: shards kept the old weights) and what save writes."""
    for o in results(job, "edits"):
        assert o["again"] == 0.0          # a second .model shows the edit
        assert o["stepped"] < 0.05        # one AdamW step from 0 (lr 3e-3), not the old ones
        assert o["loaded_all_half"]


def test_buffers_survive_a_sharded_checkpoint(job):
    for o in results(job, "buffers"):
        assert o["diff"] and all(d == 0 for d in o["diff"].values()), o["diff"]


def test_a_non_finite_gradient_on_one_rank_skips_its_whole_group_as_in_one_process(job):
    """Rank 0's slice of the group (w) was skipped and rank 1's (b) updated: the group
    half-trained. Every rank must skip it, as one process skips the whole group."""
    for o in results(job, "nonfinite"):
        assert o["gate_kept"]
        assert abs(o["loss"] - o["want_loss"]) <= 1e-5 * abs(o["want_loss"])
        assert o["worst"] < 1e-5, o


def test_a_rank_given_another_batch_is_refused_before_the_step(job):
    for o in results(job, "batch_differs"):
        one_line(o["err"], "rank 1", "same batch")
        assert o["same"]


def test_engine_model_shows_the_trained_running_statistics(job):
    for o in results(job, "model_buffers"):
        assert o["moved"] > 0.1       # the statistics moved (inputs shifted by 3)
        assert o["diff"] and all(d == 0 for d in o["diff"].values()), o["diff"]


def test_bad_loads_are_one_line_errors(job):
    for o in results(job, "bad_loads"):
        one_line(o["wider"], "another model", "same architecture")
        one_line(o["noshard"], "shard-1")
        one_line(o["json"], "state.json")
        assert o["after"] > 0


def test_save_into_a_directory_of_other_files_refuses_on_every_rank(job):
    for o in results(job, "save_other_dir"):
        one_line(o["err"], "not an outcore checkpoint")
        assert o["kept"] and o["fine"]


def test_a_save_rank_0_cannot_write_fails_on_every_rank_at_once(job):
    for o in results(job, "save_unwritable"):
        one_line(o["err"], "a-file")
        assert o["seconds"] < 10, o
        assert o["loss"] > 0 and o["ok"]


def test_a_rank_that_cannot_write_its_shard_fails_the_save_on_every_rank(job):
    o0, o1 = results(job, "shard_fails")
    one_line(o1["err"], "rank 1", "No space left on device")
    one_line(o0["err"], "rank 1")
    for o in (o0, o1):
        assert o["seconds"] < 10, o
        assert o["left"] == [], o["left"]     # neither the checkpoint nor a temporary
        assert o["loss"] > 0 and o["ok"]


def test_ranks_with_other_models_or_options_get_one_line_errors(job):
    for o in results(job, "mismatch"):
        one_line(o["model"], "rank 1", "model")
        one_line(o["clip"], "rank 1", "max_grad_norm")
        assert o["after"] > 0
