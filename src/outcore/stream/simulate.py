"""A step simulated block by block: where in the step the bytes and the CPU work fall.

balance.predict counts a step's bytes and overlaps their totals with the compute; it cannot
tell that the device-updated groups, the last of backward in the default order, put 12
B/param each way on the link in a stretch whose compute hides about 4 (session 9: the
backward's half took 0.663 s against about 0.51 s of backward compute at 3b-16k). This
model plays one step on four resources, block by block:

  compute  forward g = 1..n-1, then backward g = n-1..1, then rest's update; each block's
           share of the measured compute in proportion to its size (BACKWARD_SHARE of it
           in backward)
  h2d      a block's weights (4 B/param; none when in a slot or kept) and a device group's
           m, v (8 B/param), loaded at most PREFETCH blocks ahead of the compute
  d2h      a CPU group's gradient (4 B/param, or 2 in bf16) or a device group's master, m, v (12;
           14 with the 16-bit copy)
           after its backward; a block's backward waits until the gradient buffer it
           reuses (a ring of RING) has been copied out
  cpu      the CPU AdamW of each CPU group once its gradient is on the host, in arrival
           order (the engine's default; cpu_order.py has the opt-in "need" order); the
           next forward's load of a CPU group waits for its update

It plays STEPS steps (the CPU's and the links' backlog carries over) and returns the last
step's length. Like balance.predict it uses each direction's rate under load (LINK_BPS);
unlike it, it has no fitted overlap exponent. `bench/balance_fit.py` compares the two.
"""

from __future__ import annotations

from .balance import BACKWARD_SHARE, Rates, kept_blocks

PREFETCH = 2   # blocks ahead of the compute a load may start (3 slots: one computing)
RING = 3       # gradient buffers (Engine.grad_ring)
STEPS = 3


def simulate(numels: list[int], device: set[int], n_slots: int, rates: Rates,
             kept: int = 0, cpu_load_bytes: int = 4, cpu_grad_bytes: int = 4,
             copies: bool = False, prefetch: int = PREFETCH) -> float:
    """Seconds of one steady step (see the module docstring). numels[0] is rest (resident,
    reloaded after a CPU update); kept: device blocks whose forward loads nothing, as in
    balance.traffic; cpu_load_bytes: bytes per param a CPU-updated block's loads carry (2
    with host_weight_copy, whose CPU AdamW rate the caller lowers by the cast's cost);
    cpu_grad_bytes: a CPU-updated block's gradient out (2 where flow.half_grad); copies:
    every block keeps a 16-bit copy on the host (copy mode "all"): a device block's
    forward loads it (2 B/param) and its write-back sends it too (14 B/param out);
    prefetch: how many blocks ahead of the compute a load may start (n_slots - 1)."""
    n = len(numels)
    blocks = list(range(1, n))
    total = sum(numels[1:]) or 1
    fwd = [(1 - BACKWARD_SHARE) * rates.compute_s * numels[g] / total for g in range(n)]
    bwd = [BACKWARD_SHARE * rates.compute_s * numels[g] / total for g in range(n)]
    link = rates.link_bps
    cpu_rate = rates.cpu_params_per_s if rates.cpu_params_per_s > 0 else float("inf")
    held = kept_blocks(n, device, n_slots, kept)
    t = h2d = d2h = cpu = 0.0
    updated = {g: 0.0 for g in range(n)}   # when g's host weights are current
    start = 0.0
    for _ in range(STEPS):
        start = t
        # rest: reloaded (4 B/param) after a CPU update, before anything else computes
        if 0 not in device:
            h2d = max(h2d, updated[0]) + 4 * numels[0] / link
            t = max(t, h2d)
        done: list[float] = []             # compute end of each forward block, in order
        for i, g in enumerate(blocks):
            if (g in device and g <= n_slots) or g in held:
                ready = 0.0
            else:
                may = done[i - prefetch] if i >= prefetch else start
                nbytes = (2 if copies else 4) if g in device else cpu_load_bytes
                h2d = max(h2d, may, updated[g]) + nbytes * numels[g] / link
                ready = h2d
            t = max(t, ready) + fwd[g]
            done.append(t)
        if 0 in device:   # rest's m, v: started early in backward (rest_lead), in by its end
            h2d = max(h2d, t) + 8 * numels[0] / link
        ring: list[float] = []             # d2h end of each gradient, backward order
        starts: list[float] = []
        for i, g in enumerate(reversed(blocks)):
            weights = 4 if g in device else cpu_load_bytes
            need = (0 if g > n - 1 - n_slots else weights) + (8 if g in device else 0)
            if need:
                may = starts[i - prefetch + 1] if i >= prefetch - 1 else t
                h2d = max(h2d, may) + need * numels[g] / link
            begin = max(t, h2d if need else t, ring[i - RING] if i >= RING else 0.0)
            starts.append(begin)
            t = begin + bwd[g]
            out = (14 if copies else 12) if g in device else cpu_grad_bytes
            d2h = max(d2h, t) + out * numels[g] / link
            ring.append(d2h)
            if g in device:
                updated[g] = d2h
            else:
                cpu = max(cpu, d2h) + numels[g] / cpu_rate
                updated[g] = cpu
        # rest: its gradient after the head's backward; on the device its m, v (prefetched
        # early) and its write-back, else a gradient and a CPU update
        t += bwd[0]
        if 0 in device:
            d2h = max(d2h, t) + 12 * numels[0] / link
            updated[0] = d2h
        else:
            d2h = max(d2h, t) + 4 * numels[0] / link
            cpu = max(cpu, d2h) + numels[0] / cpu_rate
            updated[0] = cpu
    return t - start
