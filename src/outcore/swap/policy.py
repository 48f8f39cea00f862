"""Which saved tensors go to the host: only what the device budget cannot hold.

Sizes S_0..S_{n-1}: the swap candidates (>= min_swap_bytes, deduplicated) of one forward,
in the order autograd saved them. Backward needs them in about the reverse order.

  no budget     every candidate goes to the host.
  plan          (a previous forward saw the same sizes) keep the suffix S_m..S_{n-1} that
                fits in `keep_limit`, send the prefix to the host: the tensors backward
                needs first are already on the device and the prefix is fetched back while
                the suffix's backward runs. Nothing is swapped when everything fits.
  greedy        (first forward, or the sizes changed) keep while the kept bytes fit,
                send the rest.

keep_limit = gpu_memory - allocated at forward start - reserve [- 2 x window if swapping],
reserve    = reserve_bytes, or 5% of the budget + 4 x the largest candidate + pending
             .grad bytes (backward's transient buffers and parameter gradients),
window     = prefetch_bytes, or max(256 MiB, 2 x the largest candidate): the bytes in
             flight each way (waiting to go out in forward, fetched ahead in backward).
"""

from __future__ import annotations

from .config import SwapConfig

MIN_WINDOW = 256 * 1024**2


class StepPlan:
    """The decisions of one forward on one device (mutable; see BudgetPolicy)."""

    __slots__ = ("mode", "base", "limit", "m", "i", "kept", "largest", "sizes")

    def __init__(self, mode: str, base: int, largest: int):
        self.mode = mode          # "all", "plan" or "greedy"
        self.base = base          # budget - allocated - pending grads (before reserve)
        self.limit = 0            # plan mode: bytes of candidates that may stay
        self.m = 0                # plan mode: candidates with index < m go to the host
        self.i = 0                # index of the next candidate
        self.kept = 0             # bytes kept on the device so far
        self.largest = largest
        self.sizes: list[int] = []


class BudgetPolicy:
    """Per-device keep/offload decisions; remembers the last forward's sizes (the profile)."""

    def __init__(self, cfg: SwapConfig):
        self.cfg = cfg
        self.profile: list[int] | None = None

    def window(self, largest: int) -> int:
        if self.cfg.prefetch_bytes is not None:
            return self.cfg.prefetch_bytes
        return max(MIN_WINDOW, 2 * largest)

    def reserve(self, largest: int) -> int:
        if self.cfg.reserve_bytes is not None:
            return self.cfg.reserve_bytes
        return int(0.05 * self.cfg.gpu_memory) + 4 * largest

    def begin(self, allocated: int, pending_grad: int) -> StepPlan:
        """Plan a forward; `allocated`: device bytes in use now, `pending_grad`: bytes of
        parameter gradients backward will allocate (params whose .grad is None)."""
        if self.cfg.gpu_memory is None:
            return StepPlan("all", 0, 0)
        base = self.cfg.gpu_memory - allocated
        if self.cfg.reserve_bytes is None:
            base -= pending_grad
        prof = self.profile
        if not prof:
            return StepPlan("greedy", base, 0)
        largest = max(prof)
        plan = StepPlan("plan", base, largest)
        room = base - self.reserve(largest)
        if sum(prof) <= room:
            plan.limit, plan.m = room, 0
            return plan
        plan.limit = room - 2 * self.window(largest)
        m, suffix = len(prof), 0
        while m > 0 and suffix + prof[m - 1] <= plan.limit:
            suffix += prof[m - 1]
            m -= 1
        plan.m = m
        return plan

    def room(self, allocated: int, pending_grad: int) -> int | None:
        """Bytes the saved tensors of a forward starting now may take (None: no budget or
        no profile yet)."""
        if self.cfg.gpu_memory is None or not self.profile:
            return None
        base = self.cfg.gpu_memory - allocated
        if self.cfg.reserve_bytes is None:
            base -= pending_grad
        return base - self.reserve(max(self.profile))

    def offload(self, plan: StepPlan, nbytes: int) -> bool:
        """True: send this candidate to the host; False: keep it on the device."""
        i = plan.i
        plan.i += 1
        plan.sizes.append(nbytes)
        plan.largest = max(plan.largest, nbytes)
        if plan.mode == "all":
            return True
        if plan.mode == "plan":
            prof = self.profile
            if i < len(prof) and prof[i] == nbytes:
                off = i < plan.m or plan.kept + nbytes > plan.limit
                if not off:
                    plan.kept += nbytes
                return off
            plan.mode = "greedy"  # the sizes changed (new batch shape): decide one by one
        limit = plan.base - self.reserve(plan.largest) - 2 * self.window(plan.largest)
        if plan.kept + nbytes > limit:
            return True
        plan.kept += nbytes
        return False

    def end(self, plan: StepPlan) -> None:
        """Remember this forward's sizes for the next one."""
        self.profile = plan.sizes
