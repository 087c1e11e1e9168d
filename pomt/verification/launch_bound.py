"""Whether a verified schedule's speed on a GPU is the GPU's or its host's: GPU work against the wall clock.

The host issues a forward's kernels while the GPU runs earlier ones. Where the kernels take less GPU time than
the host takes to issue them, the forward waits on the host (launch-bound) and its latency follows the host's
speed, not the GPU's. Pruning cuts GPU time and reducers add kernels, so a schedule can be launch-bound where
the unpruned model is not; then the speedup verified on this host is not one another host, or this one on a
busier minute, will see. On an H100 (deit_base, batch 64, float16) the frontier shipped `tome:0=93,1=51`,
217 kernels in 3.3 ms of GPU time, verified at 1.32x; minutes later on the same machine it ran 0.81x, and on
another machine's host 1.44-1.72x.

`measure_gpu_work` profiles the shipped schedule and the unpruned model once each (`pomt.measurement.profile`, eager
on CUDA only: a CPU is its own host); `GpuWork` says how busy the GPU was in the verified forward, what the
speedup is at the GPU's own pace (the ceiling a CUDA graph of the forward approaches: on the H100 1.98x against
1.89x stated; `torch.compile`'s default mode did not, ToMe r=9 ran 0.70x compiled) and, in
`note`, says so where the GPU sat idle more than BUSY_FLOOR allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pomt.formats.schedule import Schedule
from pomt.measurement.profile import profile_forward
from pomt.verification.verify import schedule_forward_at

BUSY_FLOOR = 0.85  # below this share of the verified forward spent in GPU work, the forward waits on its host


def waits_on_host(gpu_ms: float, wall_ms: float) -> bool:
    """Whether a forward whose kernels took `gpu_ms` of GPU time in `wall_ms` waited on its host."""
    return gpu_ms / wall_ms < BUSY_FLOOR


@dataclass(frozen=True)
class GpuWork:
    """GPU time (ms) and kernels a forward of the unpruned model and the shipped schedule, and the schedule's
    verified wall-clock latency (ms) on this host."""

    unpruned_ms: float
    pruned_ms: float
    unpruned_kernels: float
    pruned_kernels: float
    wall_ms: float

    @property
    def busy(self) -> float:
        """The share of the verified forward the GPU spent in the schedule's kernels."""
        return self.pruned_ms / self.wall_ms

    @property
    def gpu_speedup(self) -> float:
        """The speedup at the GPU's own pace: unpruned GPU time over the schedule's."""
        return self.unpruned_ms / self.pruned_ms

    @property
    def launch_bound(self) -> bool:
        return waits_on_host(self.pruned_ms, self.wall_ms)

    def to_dict(self) -> dict:
        return {"unpruned_ms": round(self.unpruned_ms, 4), "pruned_ms": round(self.pruned_ms, 4),
                "unpruned_kernels": round(self.unpruned_kernels, 1), "pruned_kernels": round(self.pruned_kernels, 1),
                "wall_ms": round(self.wall_ms, 4), "busy": round(self.busy, 3),
                "gpu_speedup": round(self.gpu_speedup, 4), "launch_bound": self.launch_bound}

    def note(self, verified_speedup: float) -> str | None:
        """A sentence where the schedule was launch-bound here; None where the GPU was busy enough."""
        if not self.launch_bound:
            return None
        return (f"launch-bound on this host: the GPU worked {self.pruned_ms:.2f} ms of the schedule's "
                f"{self.wall_ms:.2f} ms forward ({self.busy:.0%}; {self.pruned_kernels:.0f} kernels against "
                f"{self.unpruned_kernels:.0f} unpruned), so its {verified_speedup:.2f}x follows how fast the host "
                f"issues kernels: a slower or busier host serving it runs it slower; at the GPU's own pace "
                f"(served from a CUDA graph: `pomt.cuda_graph`, measured with --backend cudagraph) it would run up "
                f"to {self.gpu_speedup:.2f}x")


def measure_gpu_work(model: nn.Module, x: torch.Tensor, schedule: Schedule, device: str,
                     wall_ms: float) -> GpuWork | None:
    """The GPU work of `model` patched with `schedule` (eager) and unpruned, each profiled once after a warm-up;
    None off CUDA. `wall_ms`: the schedule's verified latency here."""
    if not device.startswith("cuda"):
        return None
    forward_at = schedule_forward_at(model, x, {schedule.kept_tokens: schedule}, device=device)
    with forward_at(schedule.num_tokens) as forward:
        unpruned = profile_forward(forward, device)
    with forward_at(schedule.kept_tokens) as forward:  # patched through apply_schedule, unpatched after
        pruned = profile_forward(forward, device)
    return GpuWork(unpruned.device_time_ms, pruned.device_time_ms, unpruned.ops_per_forward,
                   pruned.ops_per_forward, wall_ms)
