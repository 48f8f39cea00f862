"""bench/balance_replay.py: what stream/balance.py's CPU_RATE comment claims of the H200
runs in bench/results (the planner's later moves, replayed with each CPU rate)."""

import importlib.util
import os

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def load():
    spec = importlib.util.spec_from_file_location("balance_replay",
                                                  os.path.join(BENCH, "balance_replay.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_highest_rate_adds_no_group_where_the_last_one_did():
    rp = load()
    numels = rp.group_numels("3b")
    plans = [p for r in rp.runs() for p in rp.replay(r, numels)]
    assert len(plans) >= 8
    # the replay reproduces what the runs did with the rate they measured...
    assert sum(p["last"] == p["logged"] for p in plans) >= len(plans) - 1
    # ...and with the highest rate measured so far no later plan adds a group
    assert all(p["best"] <= p["held"] for p in plans)
    assert sum(p["last"] > p["held"] for p in plans) >= len(plans) - 1
