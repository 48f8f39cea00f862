"""What one product did: tiles, FLOPs and bytes per device, and the rate."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..units import fmt_bytes


@dataclass
class DeviceStats:
    """One device's share. Bytes count what crossed between host and device."""
    device: str
    tiles: int = 0
    gemms: int = 0
    lt_gemms: int = 0        # of those, run on cuBLASLt's configured fp32 kernel (ltmm.py)
    flops: float = 0.0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    staged_bytes: int = 0    # host memcpy through pinned staging (pageable / strided host data)
    block_hits: int = 0
    block_misses: int = 0
    device_bytes: int = 0    # what its buffers took
    # host clock (time.perf_counter) when its buffers were ready (its first copy follows),
    # when its last task was issued, and when its device had finished (after the sync)
    t_ready: float = 0.0
    t_issued: float = 0.0
    t_synced: float = 0.0


@dataclass
class GemmStats:
    """The whole product: M x N x K, per-device stats, wall time."""
    m: int
    n: int
    k: int
    compute: str
    plan: str
    wall_s: float = 0.0
    devices: list[DeviceStats] = field(default_factory=list)
    t_start: float = 0.0     # host clock when the product's work began (after validation)
    # seconds the planner's search took (0 for a plan it had cached: a repeated shape)
    plan_s: float = 0.0

    def phases(self) -> dict:
        """Seconds from the start to the slowest device's ready / issued / synced stamps,
        and the wall: what the host spends before the first copy and after the device is
        done, beside the device's own span."""
        def last(name):
            ts = [getattr(d, name) for d in self.devices if getattr(d, name)]
            return max(ts) - self.t_start if ts and self.t_start else None
        return {"plan_s": self.plan_s, "ready_s": last("t_ready"),
                "issued_s": last("t_issued"), "synced_s": last("t_synced"),
                "wall_s": self.wall_s}

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def tflops(self) -> float:
        return self.flops / self.wall_s / 1e12 if self.wall_s > 0 else 0.0

    @property
    def h2d_bytes(self) -> int:
        return sum(d.h2d_bytes for d in self.devices)

    @property
    def d2h_bytes(self) -> int:
        return sum(d.d2h_bytes for d in self.devices)

    def summary(self) -> str:
        lines = [f"gemm {self.m}x{self.n}x{self.k} {self.compute}: {self.wall_s:.3f} s, "
                 f"{self.tflops:.2f} TFLOP/s, moved {fmt_bytes(self.h2d_bytes)} to and "
                 f"{fmt_bytes(self.d2h_bytes)} from the devices",
                 f"  plan: {self.plan}"]
        if self.plan_s >= 0.01:
            lines.append(f"  planning took {self.plan_s:.2f} s of the wall time (the first "
                         "product of a shape; later ones reuse the plan)")
        for d in self.devices:
            lt = f" ({d.lt_gemms} on cuBLASLt's configured kernel)" if d.lt_gemms else ""
            lines.append(f"  {d.device}: {d.tiles} tiles, {d.gemms} GEMMs{lt}, "
                         f"h2d {fmt_bytes(d.h2d_bytes)}, d2h {fmt_bytes(d.d2h_bytes)}, "
                         f"staged {fmt_bytes(d.staged_bytes)}, blocks {d.block_misses} loaded / "
                         f"{d.block_hits} reused, buffers {fmt_bytes(d.device_bytes)}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"m": self.m, "n": self.n, "k": self.k, "compute": self.compute,
                "wall_s": self.wall_s, "plan_s": self.plan_s, "tflops": self.tflops,
                "h2d_bytes": self.h2d_bytes, "d2h_bytes": self.d2h_bytes,
                "tiles_per_device": {d.device: d.tiles for d in self.devices},
                "lt_gemms_per_device": {d.device: d.lt_gemms for d in self.devices}}
