"""bench/gpu_session.py: a step's commands run in order, a failure or a timeout does not
stop the next, and every results file a command wrote is archived in the output dir."""

import sys
import tarfile

from .test_stream_append import load_stream_bench


def test_a_step_runs_every_command_and_copies_what_each_wrote(tmp_path):
    gs = load_stream_bench("gpu_session")
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    (results / "old.json").write_text("{}")            # not written by the step: stays
    py = sys.executable
    steps = {"s": [
        (30, [py, "-c", f"open({str(results / 'a.json')!r}, 'w').write('1')"]),
        (30, [py, "-c", "import sys; print('boom'); sys.exit(3)"]),
        (1, [py, "-c", "import time; time.sleep(5)"]),
        (30, [py, "-c", f"open({str(results / 'b.json')!r}, 'w').write('2')"]),
    ]}
    rows = gs.run_step("s", out, results=results, steps=steps)
    assert [r["rc"] for r in rows] == [0, 3, "timeout", 0]
    assert [r["wrote"] for r in rows] == ["a.json", "-", "-", "b.json"]
    with tarfile.open(out / "results.tar") as tar:
        assert sorted(tar.getnames()) == ["a.json", "b.json"]   # not old.json
        assert tar.extractfile("a.json").read() == b"1"
        assert tar.extractfile("b.json").read() == b"2"
    assert {p.name for p in out.iterdir()} == {f"s-{i}.log" for i in range(4)} | \
        {"results.tar"}
    assert "boom" in (out / "s-1.log").read_text()


def test_every_step_names_existing_scripts():
    gs = load_stream_bench("gpu_session")
    root = gs.common.ROOT
    for cmds in gs.STEPS.values():
        for _, cmd in cmds:
            if cmd[0] == "env":      # env VAR=value ... python script: the variables first
                cmd = [c for c in cmd[1:] if "=" not in c or c.startswith("-")]
            script = cmd[1]
            assert script == "-m" or (root / script).is_file(), script


def test_stream_flags_reach_only_the_stream_commands():
    gs = load_stream_bench("gpu_session")
    steps = gs.with_stream_flags(gs.STEPS, ["--no-keep-weights"])
    for name, cmds in steps.items():
        for (_, cmd), (_, plain) in zip(cmds, gs.STEPS[name]):
            stream = plain[1].endswith("stream.py")
            assert cmd == (plain + ["--no-keep-weights"] if stream else plain)
    assert gs.with_stream_flags(gs.STEPS, []) is gs.STEPS
