"""What the engine will hold on the device and the host, checked before any large allocation."""

from __future__ import annotations

from ..errors import OutcoreError
from ..units import fmt_bytes


def fixed_device_bytes(engine) -> int:
    """Device bytes that do not depend on the batch.

    block_slots fp32 slots of the largest block + 3 fp32 gradient buffers (grad ring) + its
    compute-dtype cast and one compute-dtype gradient; `rest` in fp32 with its fp32
    gradient and a cast.
    """
    numels = [g.numel for g in engine.groups]
    block = max(numels[1:], default=0)
    c = 2 if engine.compute_dtype.itemsize == 2 else 4
    slots = getattr(engine, "block_slots", 3)
    return slots * block * 4 + 3 * block * 4 + block * (c + c) + numels[0] * (4 + 4 + c)


def check_fits(engine) -> None:
    if engine.gpu_memory is None:
        return
    need = fixed_device_bytes(engine)
    if need > engine.gpu_memory:
        raise OutcoreError(
            f"the model does not fit gpu_memory={fmt_bytes(engine.gpu_memory)}: the blocks in "
            f"flight and the resident embeddings/head need {fmt_bytes(need)} before any "
            "activation; raise gpu_memory or split the model into smaller blocks")


def _staged(engine, numels: list[int]) -> str:
    """The host line's tail: the gradients that may wait for the CPU AdamW at once
    (Engine.max_staged_grads, sized in fp32; none to say where updates are held)."""
    blocks = len(numels) - 1
    if engine.hold_updates or blocks < 1:
        return ""
    cap = engine.max_staged_grads
    staged = blocks if cap is None else min(cap, blocks)
    return (f"; up to {staged} blocks' gradients ({fmt_bytes(4 * max(numels[1:]) * staged)}) "
            "wait for the CPU AdamW" + (", every block's: the host has room" if cap is None
                                        else ""))


def describe(engine) -> str:
    """A few lines: where everything lives and the bytes per parameter."""
    n = engine.num_params
    numels = [g.numel for g in engine.groups]
    copies = sum(c.numel() * c.element_size() for c in engine.host.copy if c is not None)
    lines = [
        f"outcore plan: {n / 1e6:.1f}M params in {len(numels) - 1} blocks "
        f"(largest {max(numels[1:], default=0) / 1e6:.1f}M) + {numels[0] / 1e6:.1f}M resident "
        f"[{engine.blocks_path or 'model'}]",
        f"  host:   fp32 master 4 B/param + AdamW m,v 8 B/param"
        f"{' + held gradients 4 B/param' if engine.hold_updates else ''}"
        f"{' + 16-bit copies of the blocks 2 B/param' if copies else ''}"
        f"{' (written in the AdamW pass)' if copies and engine.cast_kernel else ''}"
        f" = {fmt_bytes(n * (16 if engine.hold_updates else 12) + copies)}"
        + _staged(engine, numels),
        f"  device: {engine.device}, compute {str(engine.compute_dtype).replace('torch.', '')}, "
        f"{getattr(engine, 'block_slots', 3)} block slots + resident = "
        f"{fmt_bytes(fixed_device_bytes(engine))} fixed"
        + (f", budget {fmt_bytes(engine.gpu_memory)}" if engine.gpu_memory else ""),
        f"  micro-batch: {engine.micro_batch_size or 'whole batch'}; activation checkpoints "
        "at block boundaries on the device while they fit, else pinned host memory"
        + ("; device-updated blocks' weights kept for the next forward in the same room"
           if engine.keep.enabled else ""),
    ]
    return "\n".join(lines)
