"""The bookkeeping of swapped activations: one Handle per tensor, one Generation per forward.

Generation.schedule is the order backward is expected to use the handles in:
  - the first-use order seen in the previous forward's backward, when that forward saved
    the same sizes (a training loop: every step but the first);
  - else the reverse of the save order, node by node: autograd's engine runs ready nodes
    highest sequence number first (the reverse of creation), and a node unpacks its own
    saved tensors in save order (BatchNorm: input, then its statistics). So handles are
    sorted by the sequence number of the latest node that saved them (descending; a
    tensor saved by two nodes is needed at the later one), then by save order.
"""

from __future__ import annotations

import itertools
import weakref

import torch

from ..errors import OutcoreError
from .host import HostStore, Run

_next_seq = getattr(torch._C._autograd, "_get_sequence_nr", None)
_task_id = getattr(torch._C, "_current_graph_task_id", None)   # the running backward
_packs = itertools.count()


def node_seq() -> int:
    """Sequence number of the autograd node being created (pack runs inside its creation;
    the counter already points past it). Where torch does not expose the counter: a count
    of packs, which makes the schedule plain reverse save order."""
    return _next_seq() - 1 if _next_seq is not None else next(_packs)


def dense(t: torch.Tensor) -> bool:
    """True when t's elements fill storage[offset : offset + numel] (any dim order we know)."""
    if t.is_contiguous():
        return True
    if t.dim() == 4:
        return t.is_contiguous(memory_format=torch.channels_last)
    if t.dim() == 5:
        return t.is_contiguous(memory_format=torch.channels_last_3d)
    return False


class ModifiedError(OutcoreError, RuntimeError):
    """A saved tensor was modified in place before backward used it (a RuntimeError, as
    autograd's own error is)."""


def check_version(t: torch.Tensor, saved: int, now: int | None = None) -> None:
    """Autograd's check that a saved tensor was not modified in place since it was saved
    (`now`: its current version, default t._version; t: the tensor or a Handle): torch
    skips it for tensors packed by saved-tensor hooks, so unpack makes it."""
    now = t._version if now is None else now
    if now != saved:
        kind = str(t.dtype).replace("torch.", "")
        raise ModifiedError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{kind} {list(t.shape)}] is at version {now}; expected "
            f"version {saved} instead (checked by outcore.swap): clone it before the "
            "in-place op, or make that op out of place")


class Saved:
    """A saved tensor left where it is, with its version at save time (see check_version)."""

    __slots__ = ("t", "version")

    def __init__(self, t: torch.Tensor):
        self.t, self.version = t, t._version

    def get(self) -> torch.Tensor:
        check_version(self.t, self.version)
        return self.t


class Handle:
    """One swapped tensor: where its bytes are on the host, and its device copy if fetched.

    host: numel elements in a HostStore run; dev: the device copy (shape and strides of the
    original), held from its fetch until every pack of it was unpacked.
    """

    __slots__ = ("gen", "index", "cand", "seq", "store", "run", "host", "shape", "stride",
                 "dtype", "device", "nbytes", "event", "dev", "ready", "packs", "unpacks",
                 "ahead", "used", "src", "version", "last", "__weakref__")

    def __init__(self, gen: "Generation", cand: int, store: HostStore, run: Run,
                 t: torch.Tensor, nbytes: int):
        self.gen, self.index, self.cand, self.seq = gen, len(gen.items), cand, node_seq()
        self.store, self.run = store, run
        self.host = run.view(t.dtype, t.numel())
        self.shape, self.stride, self.dtype = t.shape, t.stride(), t.dtype
        self.device, self.nbytes = t.device, nbytes
        # The saved tensor (weak), its version at save and the last version seen: unpack
        # checks that it was not modified in place (see check()).
        self.src, self.version = weakref.ref(t), t._version
        self.last = self.version
        self.event = None      # last copy touching the host run (d2h, then each h2d)
        self.dev = None
        self.ready = None      # h2d copy into `dev` done
        self.packs, self.unpacks = 1, 0
        self.ahead = False     # fetched ahead of use and not used yet (counts in inflight)
        self.used = False      # used in the current backward
        gen.items.append(weakref.ref(self))

    def check(self) -> None:
        """Raise ModifiedError if the saved tensor was modified in place since its save: its
        version now while it is alive, else the last one seen (`last`, set when the device
        tensor is let go after its copy out; a change before then may have raced the copy)."""
        src = self.src()
        if src is not None or self.last != self.version:
            check_version(self, self.version, src._version if src is not None else self.last)

    def __del__(self):
        # Buffer reuse: the host run is reused only after the last copy touching it is done.
        try:
            if self.dev is not None and self.ready is not None:
                # Host sync (rare: fetched, then the graph was dropped before backward used
                # it): dev's memory goes back to the compute stream's pool, which never
                # waited for the h2d copy still writing into it.
                self.ready.synchronize()
            self.store.free(self.run, after=self.event)
        except Exception:  # interpreter shutdown: nothing left to return the run to
            pass


class Generation:
    """The handles of one forward (pack order), the backward schedule and its cursor."""

    __slots__ = ("id", "items", "sizes", "seen", "schedule", "cursor", "inflight", "window",
                 "used", "backwards", "task", "__weakref__")

    def __init__(self, gid: int):
        self.id = gid
        self.items: list[weakref.ref] = []   # weak: autograd owns the handles
        self.sizes: list[int] = []           # every swap candidate's bytes, kept ones too
        self.seen: dict[tuple, tuple] = {}   # dedup key -> (weakref to tensor, handle|None)
        self.schedule: list[weakref.ref] = []
        self.cursor = 0                      # first schedule position not yet fetched
        self.inflight = 0                    # bytes fetched ahead and not used yet
        self.window = 0                      # prefetch window, bytes
        self.used: list[int] = []            # candidate indices in first-use order
        self.backwards = 0
        self.task = None                     # the backward that started the current pass

    def plan_schedule(self, prev: "Generation | None") -> None:
        """Order the handles for backward (see the module docstring)."""
        seqs = []
        for i, ref in enumerate(self.items):
            h = ref()
            seqs.append((-(h.seq if h is not None else -1), i))
        default = [i for _, i in sorted(seqs)]
        order: list[int] = []
        if prev is not None and prev.used and prev.sizes == self.sizes:
            by_cand = {}
            for i, ref in enumerate(self.items):
                h = ref()
                if h is not None:
                    by_cand[h.cand] = i
            order = [by_cand[c] for c in prev.used if c in by_cand]
        taken = set(order)
        order += [i for i in default if i not in taken]
        self.schedule = [self.items[i] for i in order]
        self.cursor = 0

    def start_backward(self) -> None:
        """Backward reached an output of this forward: a new pass over the handles, unless
        another output (a model returning several) already started this same backward."""
        task = _task_id() if _task_id is not None else None
        if task is not None and task == self.task:
            return
        self.task = task
        self.backwards += 1
        self.cursor, self.inflight = 0, 0
        if self.backwards > 1:  # retain_graph: a second pass over the same handles
            for ref in self.items:
                h = ref()
                if h is not None:
                    h.used, h.ahead = False, False

    def next_ahead(self) -> Handle | None:
        """The next handle to prefetch per the schedule, or None; moves the cursor."""
        sched = self.schedule
        while self.cursor < len(sched):
            h = sched[self.cursor]()
            if h is not None and h.dev is None and not h.used:
                return h
            self.cursor += 1
        return None

