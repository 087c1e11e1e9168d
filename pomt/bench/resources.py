"""Peak memory of one forward and GPU power/energy while a variant runs.

Memory: the variant's own weights plus the peak of the tensors its forward allocates, i.e. what the
variant would peak at alone. On CUDA from `max_memory_allocated`; on CPU (which has no allocator
statistics) from a dispatch mode that tracks the live storages created by aten ops. On CPU the process's
peak RSS growth during the forward is reported too (Linux `VmHWM` reset through `/proc/self/clear_refs`,
else psutil sampling); it is often 0, as the allocator reuses memory already resident.
Power: NVML board power sampled in a background thread during a timed loop; NVIDIA only.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pomt.device import gpu_power_w
from pomt.measure import synchronize

MB = 1024**2
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class Memory:
    """Peak memory of a forward in MB, what kind of number it is, and (CPU) the RSS growth."""

    peak_mb: float | None
    kind: str  # "cuda_max_allocated", "cpu_max_allocated", or "" when not measured
    rss_delta_mb: float | None = None


class LiveTensorPeak(TorchDispatchMode):
    """Peak bytes of live tensor storages created by aten ops inside the mode (views counted once)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.bytes = 0
        self.peak = 0

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
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark for this process; False where Linux does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


class Sampler:
    """Call `read()` every `interval_s` in a background thread while the context is open."""

    def __init__(self, read: Callable[[], float | None], interval_s: float = 0.005) -> None:
        self.read, self.interval_s = read, interval_s
        self.values: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            value = self.read()
            if value is not None:
                self.values.append(float(value))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _rss_delta_mb(fn: Callable[[], object], repeats: int) -> float:
    gc.collect()
    if _reset_peak_rss():
        before = _status_kb("VmRSS") or 0
        for _ in range(repeats):
            fn()
        return max(0.0, ((_status_kb("VmHWM") or 0) - before) / 1024)
    process = psutil.Process()
    before = process.memory_info().rss
    with Sampler(lambda: process.memory_info().rss, 0.001) as sampler:
        for _ in range(repeats):
            fn()
    return max(0.0, (max(sampler.values, default=before) - before) / MB)


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
            tracker = LiveTensorPeak()
            with tracker:
                fn()
            peak = (tracker.peak + weight_bytes(model)) / MB
            return Memory(peak, "cpu_max_allocated", _rss_delta_mb(fn, repeats))
    return Memory(None, "")


def power_and_energy(fn: Callable[[], object], device: str, batch: int, min_s: float = 2.0) -> Power:
    """Mean NVML power while calling `fn` for at least `min_s` seconds; energy per image from it.

    NVML updates its power reading every ~20-100 ms and some boards average over a second, hence a loop
    of a couple of seconds per variant.
    """
    if not device.startswith("cuda"):
        return Power(None, None, 0, f"power is measured on NVIDIA GPUs only (not on {device})")
    index = torch.device(device).index or 0
    if gpu_power_w(index) is None:
        return Power(None, None, 0, "NVML cannot read this GPU's power")
    calls = 0
    with torch.inference_mode():
        synchronize(device)
        with Sampler(lambda: gpu_power_w(index), 0.01) as sampler:
            start = time.perf_counter()
            while time.perf_counter() - start < min_s or calls < 5:
                fn()
                calls += 1
                if calls % 8 == 0:
                    synchronize(device)
            synchronize(device)
            elapsed = time.perf_counter() - start
    if not sampler.values:
        return Power(None, None, 0, "NVML returned no power samples")
    watts = sum(sampler.values) / len(sampler.values)
    return Power(watts, watts * elapsed / (calls * batch), len(sampler.values), "NVML board power")
