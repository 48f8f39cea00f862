"""pin_/unpin_ bookkeeping without a GPU: a fake CUDA runtime records the calls.

unpin_ must unregister only what pin_ registered (a pinned copy from torch's allocator is
not registered, and unregistering it fails), and every failed runtime call must clear the
runtime's last error, which the next kernel launch would otherwise raise as its own.
"""

import pytest
import torch

from outcore.memory import pinned


class FakeRuntime:
    def __init__(self, register_rc=0):
        self.calls = []
        self.register_rc = register_rc

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.calls.append(("register", ptr))
        return self.register_rc

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0

    def cudaGetLastError(self):
        self.calls.append(("clear", None))
        return 0


@pytest.fixture
def runtime(monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setattr(pinned, "_cuda_ok", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: False)
    return rt


def test_unpin_undoes_only_what_pin_registered(runtime):
    big = torch.empty(pinned._REGISTER_MIN // 4)
    other = torch.empty(pinned._REGISTER_MIN // 4)
    assert pinned.pin_(big) is big
    pinned.unpin_(other)            # never registered: no runtime call
    pinned.unpin_(big)
    pinned.unpin_(big)              # twice: the second is a no-op
    ptr = big.untyped_storage().data_ptr()
    assert runtime.calls == [("register", ptr), ("unregister", ptr)]


def test_failed_register_clears_the_runtime_error(runtime):
    runtime.register_rc = 1
    big = torch.empty(pinned._REGISTER_MIN // 4)
    with pytest.raises(RuntimeError, match="cudaHostRegister"):
        pinned.pin_(big)
    assert runtime.calls[-1] == ("clear", None)
    pinned.unpin_(big)              # the failed registration left nothing to undo
    assert ("unregister", big.untyped_storage().data_ptr()) not in runtime.calls


def test_unpin_from_a_finalizer_while_the_registry_is_locked(runtime, monkeypatch):
    """gemm.Linear unpins from a weakref finalizer, which the garbage collector can run in
    the thread that holds the registry's lock (inside pin_): that must not deadlock."""
    import threading

    monkeypatch.setattr(pinned, "_REG_LOCK", type(pinned._REG_LOCK)())  # a stuck thread
    old = torch.empty(pinned._REGISTER_MIN // 4)                       # keeps only this one
    new = torch.empty(pinned._REGISTER_MIN // 4)

    class Collecting(set):
        def add(self, ptr):                 # a collection runs a finalizer right here
            super().add(ptr)
            if ptr == new.untyped_storage().data_ptr():
                pinned.unpin_(old)

    monkeypatch.setattr(pinned, "_REGISTERED", Collecting())
    pinned.pin_(old)
    t = threading.Thread(target=pinned.pin_, args=(new,), daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "pin_ deadlocked on its own registry lock"
    assert ("unregister", old.untyped_storage().data_ptr()) in runtime.calls
