"""bench/balance_replay.py: what stream/balance.py's CPU_RATE comment claims of the H200
runs in bench/results (the planner's later moves, replayed with each CPU rate)."""

from .test_stream_append import load_stream_bench


def load():
    return load_stream_bench("balance_replay")


def test_the_highest_rate_adds_no_group_where_the_last_one_did():
    rp = load()
    numels = rp.group_numels("3b")
    plans = [p for r in rp.runs() for p in rp.replay(r, numels)]
    assert len(plans) >= 8
    # the replay reproduces what the runs did with the rate they measured...
    assert sum(p["last"] == p["logged"] for p in plans) >= len(plans) - 1
    # ...and with the highest rate measured so far no later plan adds a group, where
    # backward waited at 8 staged gradients (sessions 6-29); without that cap (session 30)
    # the first move is the head alone and later ones add groups at any rate
    capped = [p for p in plans if p["cap"] == 8]
    assert len(capped) >= 8 and all(p["best"] <= p["held"] for p in capped)
    assert any(p["best"] > p["held"] for p in plans if p["cap"] is None)
    # with the rate each step measured, every later plan moves groups: most add, and the
    # rest hand back groups the run had added on a lower rate (session 32's
    # ab-s32a-balance: 16 groups at 2.22 G params/s, then 14 and 12 as the rate rose)
    adds = [p for p in plans if p["last"] > p["held"]]
    backs = [p for p in plans if p["last"] < p["held"]]
    assert len(adds) + len(backs) >= len(plans) - 1 and len(adds) > 3 * len(backs)
    assert all(p["logged"] == p["last"] for p in backs)
