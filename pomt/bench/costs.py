"""What a variant costs beside its latency: FLOPs, peak memory, and GPU power and energy.

FLOPs are counted by `torch.utils.flop_counter`: a matmul of (M, K) by (K, N) counts 2·M·N·K, element-wise work
(norms, softmax, GELU, gathers) 0, and CPU attention, absent from torch's registry, by torch's own SDPA formula.
Memory is the variant's weights plus the peak of the tensors its forward allocates (CUDA's allocator statistics;
on the CPU a dispatch mode tracking live storages). Power is NVML board power sampled during a timed loop.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pomt.device import gpu_power_w
from pomt.measurement.timing import synchronize, time_callable
from pomt.patching import patch, unpatch

_ATEN = torch.ops.aten
MB = 1024**2


def _extra_formulas() -> dict:
    """FLOP formulas for attention ops that torch's registry lacks (CPU flash attention)."""
    extra = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"):
        op = getattr(_ATEN, name, None)
        if op is not None and op not in flop_counter.flop_registry:
            extra[op] = _sdpa_flops
    return extra


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's SDPA count (q·kᵀ and probs·v); FlopCounterMode passes shapes, not tensors."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of `model(x)` as counted by `FlopCounterMode` (with CPU attention included). Its module tracker hooks
    every module input that requires grad, which a view of a parameter does even in inference mode (SigLIP's
    attention-pool latent), so the parameters stop requiring grad while it counts."""
    learning = [p for p in model.parameters() if p.requires_grad]
    for parameter in learning:
        parameter.requires_grad_(False)
    counter = flop_counter.FlopCounterMode(display=False, custom_mapping=_extra_formulas())
    try:
        with torch.inference_mode(), counter as mode:
            model(x)
    finally:
        for parameter in learning:
            parameter.requires_grad_(True)
    return int(mode.get_total_flops())


def meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy whose parameters and buffers are on the meta device: shapes without data, so counting its FLOPs
    does no arithmetic and copies no weights."""
    tensors = [*model.parameters(), *model.buffers()]
    memo = {
        id(t): nn.Parameter(t.detach().to("meta"), t.requires_grad) if isinstance(t, nn.Parameter) else t.to("meta")
        for t in tensors
    }
    return copy.deepcopy(model, memo)


def match_amount(flops_at: Callable[[int], float], target: float, low: int, high: int) -> int:
    """The amount in [low, high] whose FLOPs are closest to `target`, for FLOPs non-increasing in amount."""
    if low > high:
        raise ValueError(f"empty amount range [{low}, {high}]")
    lo, hi = low, high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if flops_at(mid) > target:
            lo = mid
        else:
            hi = mid
    return min((lo, hi), key=lambda amount: abs(flops_at(amount) - target))


FlopsFn = Callable[[str | None, Mapping[int, int]], float]


def flops_function(base: nn.Module, example: torch.Tensor) -> FlopsFn:
    """FLOPs of the base model on `example` under (method, removal), counted on a weightless copy; a method whose
    forward needs real data (`random`'s seeded generator) on a real copy."""
    copies: dict[str, tuple[nn.Module, torch.Tensor]] = {}

    def count_on(kind: str, method: str | None, removal: Mapping[int, int]) -> float:
        if kind not in copies:
            copies[kind] = (meta_copy(base), example.to("meta")) if kind == "meta" else (copy.deepcopy(base), example)
        model, x = copies[kind]
        unpatch(model)
        if method and removal:
            patch(model, method, dict(removal))
        return float(count_flops(model, x))

    def counted(method: str | None, removal: Mapping[int, int]) -> float:
        try:
            return count_on("meta", method, removal)
        except (RuntimeError, NotImplementedError):  # an op the meta device cannot run
            return count_on("real", method, removal)

    return counted


@dataclass(frozen=True)
class Memory:
    """Peak memory of a forward in MB and what kind of number it is."""

    peak_mb: float | None
    kind: str  # "cuda_max_allocated", "cpu_max_allocated", or "" when not measured


class LiveTensorPeak(TorchDispatchMode):
    """Peak bytes of live tensor storages created by aten ops inside the mode (views counted once)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.bytes = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key in [key for key, (ref, _) in self.live.items() if ref.expired()]:
            self.bytes -= self.live.pop(key)[1]
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                pointer = storage.data_ptr()
                if pointer and pointer not in self.live:
                    self.live[pointer] = (StorageWeakRef(storage), storage.nbytes())
                    self.bytes += storage.nbytes()
        self.peak = max(self.peak, self.bytes)
        return out


@dataclass(frozen=True)
class Power:
    """Mean board power while a variant ran, and the energy per image it implies."""

    power_w: float | None
    energy_j_per_img: float | None
    samples: int
    note: str


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


class Sampler:
    """Call `read()` every `interval_s` in a background thread while the context is open."""

    def __init__(self, read: Callable[[], float | None], interval_s: float = 0.005) -> None:
        self.read, self.interval_s = read, interval_s
        self.values: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if (value := self.read()) is not None:
                self.values.append(float(value))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def peak_memory(fn: Callable[[], object], model: nn.Module, device: str, repeats: int = 2) -> Memory:
    """Peak memory of `fn()` (one forward of `model`) on `device`; see the module docstring."""
    with torch.inference_mode():
        fn()  # allocator warm-up: later calls reuse cached blocks
        if device.startswith("cuda"):
            synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            for _ in range(repeats):
                fn()
            synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) - before + weight_bytes(model)
            return Memory(peak / MB, "cuda_max_allocated")
        if device == "cpu":
            with LiveTensorPeak() as tracker:
                fn()
            return Memory((tracker.peak + weight_bytes(model)) / MB, "cpu_max_allocated")
    return Memory(None, "")


def power_and_energy(fn: Callable[[], object], device: str, batch: int, min_s: float = 2.0) -> Power:
    """Mean NVML power while `fn` is timed for at least `min_s` seconds; energy per image = power x time per call /
    batch. NVML updates its reading every ~20-100 ms and some boards average over a second, hence a few seconds."""
    if not device.startswith("cuda"):
        return Power(None, None, 0, f"power is measured on NVIDIA GPUs only (not on {device})")
    index = torch.device(device).index or 0
    if gpu_power_w(index) is None:
        return Power(None, None, 0, "NVML cannot read this GPU's power")
    with Sampler(lambda: gpu_power_w(index), 0.01) as sampler:
        stats, _ = time_callable(fn, device=device, min_run_s=min_s)
    if not sampler.values:
        return Power(None, None, 0, "NVML returned no power samples")
    watts = sum(sampler.values) / len(sampler.values)
    return Power(watts, watts * stats.mean_ms / 1e3 / batch, len(sampler.values), "NVML board power")
