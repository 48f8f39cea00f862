"""SwapConfig: the knobs of `outcore.swap`, typed and validated once.

Every size accepts bytes or a string like "16GiB" (see outcore.units). A None window or
reserve means "auto": sized from the tensors seen in the previous forward (see policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OutcoreError
from ..units import parse_bytes

MiB = 1024**2


@dataclass(frozen=True)
class SwapConfig:
    """What to swap, under which device budget, and how far ahead to fetch.

    gpu_memory      device bytes the model's step may use (per device). With a budget,
                    saved activations stay on the device while they fit under it (minus
                    `reserve_bytes`) and only the excess goes to the host. None: every
                    saved tensor >= min_swap_bytes goes to the host.
    min_swap_bytes  saved tensors smaller than this stay on the device (copy overhead
                    would exceed the memory won).
    prefetch_bytes  window of backward prefetch: bytes fetched back ahead of their use and
                    not used yet; also bounds bytes waiting to be copied out in forward.
                    None: auto, twice the largest swapped tensor (at least 256 MiB).
    reserve_bytes   part of gpu_memory left for what cannot be swapped: backward's
                    gradient buffers, workspaces, parameter gradients. None: auto, 5% of
                    the budget + 4 x the largest saved tensor + pending .grad bytes.
    swap_params     also keep parameters of modules not running in host memory (opt-in;
                    see params.py for when they live where). Each parameter must be used
                    only in the forward of the module that owns it (nn.MultiheadAttention,
                    which reads its out_proj weight itself, moves as one unit with
                    out_proj); the first forward of each new input signature checks it
                    and refuses in one line (param_guard.py), as does a model with a
                    torch.compile'd module (compiled code skips the fetching hooks); a
                    frozen one (requires_grad=False) must change only through in-place
                    ops that bump its version (copy_ under no_grad), not .data.
    param_prefetch_bytes  window of parameter prefetch (next modules' weights).
    force_copy      swap tensors that already live in host memory (CPU device) too, through
                    a separate host buffer: lets CPU tests exercise the offload path.
    host_memory     cap on pinned host bytes for swapping; None: no cap.
    slab_bytes      pinned host memory is reserved in slabs of this size (pinned once).
    timing          time copies and compute stalls with device events (for the report).
    by_module       attribute swapped bytes to the module whose forward saved them (the
                    innermost one running; report).
    trace           record every offload and fetch decision in order (tests, debugging).
    expandable_segments  CUDA's caching allocator with expandable segments while the swap
                    is open (allocator.py: 2.7-2.9x wide_resnet101_2's largest batch on the
                    H200). None: on unless the environment's allocator settings name them;
                    True: on; False: the allocator is left alone.
    """

    gpu_memory: int | None = None
    min_swap_bytes: int = 1 * MiB
    prefetch_bytes: int | None = None
    reserve_bytes: int | None = None
    swap_params: bool = False
    param_prefetch_bytes: int = 256 * MiB
    force_copy: bool = False
    host_memory: int | None = None
    slab_bytes: int = 256 * MiB
    timing: bool = True
    by_module: bool = True
    trace: bool = False
    expandable_segments: bool | None = None

    @classmethod
    def build(cls, gpu_memory=None, min_swap_bytes="1MiB", prefetch_bytes=None,
              reserve_bytes=None, swap_params=False, param_prefetch_bytes="256MiB",
              force_copy=False, host_memory=None, slab_bytes="256MiB", timing=True,
              by_module=True, trace=False, expandable_segments=None) -> "SwapConfig":
        """Parse and check user values; raises OutcoreError/TypeError with one line."""
        for name, flag in (("swap_params", swap_params), ("force_copy", force_copy),
                           ("timing", timing), ("by_module", by_module), ("trace", trace)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}={flag!r} must be True or False")
        if expandable_segments is not None and not isinstance(expandable_segments, bool):
            raise TypeError(f"expandable_segments={expandable_segments!r} must be None "
                            "(auto), True or False")
        for name, value in (("min_swap_bytes", min_swap_bytes), ("slab_bytes", slab_bytes),
                            ("param_prefetch_bytes", param_prefetch_bytes)):
            if value is None:
                raise OutcoreError(f"{name}=None is not a size: give bytes or a string "
                                   "such as '1MiB'")
        reserve = None
        if reserve_bytes is not None:
            reserve = 0 if _zero(reserve_bytes) else parse_bytes(reserve_bytes, "reserve_bytes")
        cfg = cls(
            gpu_memory=parse_bytes(gpu_memory, "gpu_memory"),
            min_swap_bytes=parse_bytes(min_swap_bytes, "min_swap_bytes"),
            prefetch_bytes=parse_bytes(prefetch_bytes, "prefetch_bytes"),
            reserve_bytes=reserve,
            swap_params=swap_params,
            param_prefetch_bytes=parse_bytes(param_prefetch_bytes, "param_prefetch_bytes"),
            force_copy=force_copy,
            host_memory=parse_bytes(host_memory, "host_memory"),
            slab_bytes=parse_bytes(slab_bytes, "slab_bytes"),
            timing=timing, by_module=by_module, trace=trace,
            expandable_segments=expandable_segments)
        for name, value in (("gpu_memory", gpu_memory), ("min_swap_bytes", min_swap_bytes),
                            ("prefetch_bytes", prefetch_bytes), ("host_memory", host_memory),
                            ("param_prefetch_bytes", param_prefetch_bytes),
                            ("slab_bytes", slab_bytes)):
            if getattr(cfg, name) == 0:   # a fraction of a byte, such as 0.5
                raise OutcoreError(f"{name}={value!r} is less than one byte: give a whole "
                                   "number of bytes or a string such as '16GiB'")
        if cfg.gpu_memory is not None and cfg.reserve_bytes is not None \
                and cfg.reserve_bytes >= cfg.gpu_memory:
            raise OutcoreError(f"reserve_bytes={reserve_bytes!r} must be below "
                               f"gpu_memory={gpu_memory!r}: lower the reserve or raise the budget")
        return cfg


def _zero(value) -> bool:
    """True for a reserve of zero written as 0, 0.0 or a string such as "0" or "0GiB"."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value == 0
    if isinstance(value, str):
        try:
            return float(value.strip().rstrip("BbKkMmGgTtIi ")) == 0
        except ValueError:
            return False
    return False
