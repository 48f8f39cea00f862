"""parallel/signals.py in one process: a first SIGINT waits for deliver(), a second one goes
through at once, unwrap() puts the program's handler back."""

import signal

from outcore.parallel.signals import Agreement


def test_first_signal_waits_second_goes_through():
    calls = []
    old = signal.signal(signal.SIGINT, lambda s, f: calls.append(s))
    try:
        a = Agreement()
        a.wrap()
        a.wrap()   # idempotent: not wrapped twice
        signal.raise_signal(signal.SIGINT)
        assert calls == [] and a.notes() == [1.0, 0.0]
        a.deliver([1.0, 0.0])
        assert calls == [signal.SIGINT] and a.notes() == [0.0, 0.0]
        a.deliver([1.0, 0.0])   # another rank's note: handed on here too
        assert len(calls) == 2
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)   # the user insists: both now
        assert len(calls) == 4 and a.notes() == [0.0, 0.0]
        a.unwrap()
        signal.raise_signal(signal.SIGINT)
        assert len(calls) == 5
    finally:
        signal.signal(signal.SIGINT, old)
