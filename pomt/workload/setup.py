"""What a measuring run is set up with, resolved and checked before any model is built: the model's timm
name, the device with its fingerprint and, on a CPU, the host allocator (refusing unlocked clocks when
asked), batch and input size, and the stem `<model>_<device>_bs<B>_is<S>` that all of the run's output
files share. The offline computation and the benchmark both start here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pomt.checks import check_batch_size
from pomt.device import Fingerprint, device_fingerprint, resolve_device
from pomt.device import require_locked_clocks as refuse_unlocked_clocks
from pomt.device.allocator import check_allocator, use_allocator
from pomt.models.registry import architecture, default_input_size, normalise_input_size, resolve_model_name


@dataclass(frozen=True)
class RunSetup:
    """The resolved setting of one run."""

    model: str  # timm name, pretrained tag kept
    device: str  # cpu, cuda, cuda:N or mps
    fingerprint: Fingerprint
    batch_size: int
    input_size: tuple[int, int]

    @property
    def architecture(self) -> str:
        return architecture(self.model)

    @property
    def stem(self) -> str:
        return output_stem(self.model, self.device, [self.batch_size], [self.input_size])

    def at(self, batch_size: int, input_size: int | tuple[int, int]) -> RunSetup:
        """The same run at another batch size and input size (a cell of a sweep)."""
        return replace(self, batch_size=check_batch_size(batch_size), input_size=normalise_input_size(input_size))


def output_stem(
    model: str, device: str, batch_sizes: Sequence[int], input_sizes: Sequence[tuple[int, int]]
) -> str:
    """`<model>_<device>_bs<B>_is<S>`; a sweep joins its batch and input sizes with "-"."""
    sizes = "-".join(str(h) if h == w else f"{h}x{w}" for h, w in input_sizes)
    batches = "-".join(map(str, batch_sizes))
    return f"{architecture(model)}_{device.split(':')[0]}_bs{batches}_is{sizes}"


def prepare_run(
    model: str,
    device: str = "auto",
    threads: int | None = None,
    batch_size: int = 1,
    input_size: int | tuple[int, int] | None = None,
    require_locked_clocks: bool = False,
    allocator: str = "steady",
) -> RunSetup:
    """Resolve the model name, sizes and device, set the host allocator on a CPU (`allocator`:
    `pomt.device.allocator.use_allocator`), and take the device's fingerprint (which records the allocator);
    with `require_locked_clocks`, raise DeviceError unless its clocks are locked."""
    name = resolve_model_name(model)
    batch = check_batch_size(batch_size)
    size = normalise_input_size(input_size) or default_input_size(name)
    resolved = resolve_device(device)
    check_allocator(allocator)  # on every device, so a typo is refused before any GPU run too
    if resolved == "cpu":
        use_allocator(allocator)
    fingerprint = device_fingerprint(resolved, threads)
    if require_locked_clocks:
        refuse_unlocked_clocks(fingerprint)
    return RunSetup(name, resolved, fingerprint, batch, size)
