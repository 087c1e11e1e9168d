"""What `pomt bench` compares and how, checked once before any model is built, and the run it resolves to: `resolve`
fills the defaults a schedule gives (model, batch and input size, dtype, runtime) and how the amounts are set."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pomt.checks import METHODS, check_method, check_options, check_threads
from pomt.device.allocator import ALLOCATOR_HELP, ALLOCATORS
from pomt.errors import DatasetError, ScheduleError, SettingError
from pomt.formats.schedule import Schedule, load_schedule
from pomt.models.registry import MAX_INPUT_SIZE
from pomt.offline.config import SAMPLE_CAP
from pomt.options import ADVANCED, CHOICE, MEASUREMENT, SEED_MAX, WORKLOAD, option
from pomt.runtimes import BACKENDS, DTYPES, Backend
from pomt.workload.prepare import Host, RunSetup, Workload, prepare_run

RANDOM_SAMPLES = 500  # random inputs whose agreement with the unpruned model is measured without a folder

BASELINE = "none"
SCHEDULE = "schedule"
VALID_METHODS = (BASELINE, *METHODS)
MATCHES = ("auto", "latency", "flops", "none")


def variant_methods(methods: str | Sequence[str]) -> list[str]:
    """The methods to compare (a sequence, or comma-separated), checked, deduplicated, the unpruned baseline first."""
    if isinstance(methods, str):
        methods = [method.strip() for method in methods.split(",") if method.strip()]
    checked = [check_method(method, VALID_METHODS) for method in dict.fromkeys(methods)]
    return [BASELINE] + [method for method in checked if method != BASELINE]


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark and how; each field is also the CLI option of its name (`pomt.options`)."""

    model: str | None = option(None, "timm name or alias (default: the schedule's model).", panel=WORKLOAD)
    schedule: Path | str | Schedule | None = option(None, "Schedule JSON to compare with the unpruned model.",
                                                    panel=WORKLOAD)
    methods: str | tuple[str, ...] = option(
        BASELINE, f"Comma-separated variants: {', '.join(VALID_METHODS)} (none is always run).", panel=CHOICE)
    remove: int | None = option(None, "Tokens removed at --prune-block (pomt/topk/l2norm/random).", min=0, panel=CHOICE)
    r: int | None = option(None, "ToMe: tokens merged per block.", min=0, panel=CHOICE)
    prune_block: int = option(3, "Block that prunes (0-based).", min=0, panel=CHOICE)
    keep_rate: float | None = option(None, "Instead of --remove: patch tokens kept, in (0, 1].", min=0, max=1,
                                     panel=CHOICE)
    match: str = option("auto", "How the reducers' amounts are set against a --schedule: latency (tuned to its "
                                "measured latency here), flops, or none (the amounts given); auto: latency when "
                                "a schedule is given without --remove/--r/--keep-rate, else none.",
                        choices=MATCHES, panel=CHOICE)
    match_rounds: int = option(10, "--match latency: paired rounds per probed setting.", min=2, panel=MEASUREMENT)
    batch_size: int | None = option(None, "Batch size (default: the schedule's, else 1).", min=1, panel=WORKLOAD)
    input_size: int | tuple[int, int] | None = option(None, "Input size in pixels (default: schedule's/model's).",
                                                      min=1, max=MAX_INPUT_SIZE, panel=WORKLOAD)
    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps.", panel=WORKLOAD)
    threads: int | None = option(None, "CPU threads (default: torch's).", min=1, panel=WORKLOAD)
    allocator: str = option("steady", ALLOCATOR_HELP, choices=ALLOCATORS, panel=ADVANCED)
    dtype: str | None = option(None, "Model and input dtype (default: the schedule's, else float32; bfloat16 on "
                                     "CPU, float16 on CUDA).", choices=DTYPES, panel=WORKLOAD)
    backend: str | None = option(None, "Runtime every variant is timed on (default: the schedule's, else eager; "
                                       "a static program per variant).", choices=BACKENDS, panel=WORKLOAD)
    rounds: int = option(30, "Interleaved timing rounds (one sample per variant each).", min=1, panel=MEASUREMENT)
    calls_per_round: int = option(1, "Back-to-back forwards per sample.", min=1, panel=MEASUREMENT)
    warmup: int = option(3, "Warm-up forwards per variant.", min=0, panel=MEASUREMENT)
    dataset_root: Path | str | None = option(None, "ImageFolder for top-1 accuracy.", panel=CHOICE)
    agreement: bool = option(False, "Accuracy as agreement with the unpruned model, --dataset-root's labels "
                                    "ignored (for images whose classes are not the model's).", panel=CHOICE)
    accuracy_samples: int | None = option(
        None, f"Images for accuracy: as the offline computation's by default (the whole folder, at most "
              f"{SAMPLE_CAP:,}; {RANDOM_SAMPLES} random inputs, agreement, without one); 0: skip.", min=0, panel=CHOICE)
    checkpoint: Path | str | None = option(None, "Local weights (state dict or timm checkpoint).", panel=WORKLOAD)
    pretrained: bool = option(False, "Fetch timm's pretrained weights.", negatable=True, panel=WORKLOAD)
    require_locked_clocks: bool = option(False, "Refuse to measure unless clocks are locked.", panel=MEASUREMENT)
    profile: bool = option(True, "Count ops/kernels with torch.profiler.", negatable=True, panel=MEASUREMENT)
    power_seconds: float = option(2.0, "Seconds per variant of power sampling (GPU).", min=0, panel=MEASUREMENT)
    seed: int = option(0, "Seed for inputs and random pruning.", min=0, max=SEED_MAX, panel=ADVANCED)

    def check(self) -> BenchConfig:
        """Raise for settings outside their ranges before anything is built."""
        check_options(self)
        check_threads(self.threads)
        if self.keep_rate is not None and not self.keep_rate > 0:
            raise SettingError(f"--keep-rate must lie in (0, 1], got {self.keep_rate:g}")
        if self.keep_rate is not None and self.remove is not None:
            raise SettingError("--remove and --keep-rate both say how many tokens to remove: give one")
        if isinstance(self.methods, str) and not self.methods.replace(",", "").strip():
            raise SettingError(f"--methods names no variant ({self.methods!r}); give one or more of "
                               f"{', '.join(VALID_METHODS)}")
        variant_methods(self.methods)
        if self.match not in MATCHES:
            raise SettingError(f"--match must be one of {', '.join(MATCHES)}, got {self.match!r}")
        if self.dataset_root is not None and not Path(self.dataset_root).is_dir():
            raise DatasetError(f"dataset folder not found: {self.dataset_root}")
        return self


@dataclass(frozen=True)
class Setup:
    """The checked configuration, its schedule and the run they resolve to (a sweep changes the run per cell);
    `methods` the variants in order, `match` how the reducers' amounts are set (latency, flops or none)."""

    config: BenchConfig
    schedule: Schedule | None
    run: RunSetup
    methods: tuple[str, ...]
    match: str = "none"

    def workload(self) -> Workload:
        """The run as the workload `pomt.workload.prepare.prepare` builds the model and input from."""
        config, run = self.config, self.run
        return Workload(model=run.model, batch_size=run.batch_size, input_size=run.input_size, device=run.device,
                        threads=config.threads, allocator=config.allocator, dtype=config.dtype,
                        backend=config.backend, require_locked_clocks=config.require_locked_clocks, seed=config.seed)


def resolve(config: BenchConfig) -> Setup:
    """Check the configuration and resolve the run before any model is built."""
    config.check()
    schedule = load_schedule(config.schedule) if config.schedule is not None else None
    if config.model is None and schedule is None:
        raise ScheduleError("give --model or a --schedule (whose model is used)")
    match = resolve_match(config, schedule is not None)
    if config.dtype is None:  # a schedule is measured in the dtype it was made for unless told otherwise
        config = replace(config, dtype=schedule.dtype if schedule is not None else "float32")
    if config.backend is None:  # and on the runtime it was verified on
        config = replace(config, backend=schedule.backend_name if schedule is not None else Backend.EAGER.value)
    batch = config.batch_size if config.batch_size is not None else (schedule.batch_size if schedule else 1)
    size = config.input_size if config.input_size is not None else (schedule.input_size if schedule else None)
    run = prepare_run(config.model or schedule.model, config.device, config.threads, batch, size,
                      Host(config.allocator, config.require_locked_clocks))
    return Setup(config, schedule, run, tuple(variant_methods(config.methods)), match)


def resolve_match(config: BenchConfig, has_schedule: bool) -> str:
    """latency, flops or none: what `config.match` (checked) means with or without a schedule (see its help)."""
    given = [flag for flag, value in (("--remove", config.remove), ("--r", config.r),
                                      ("--keep-rate", config.keep_rate)) if value is not None]
    if config.match == "auto":
        return "latency" if has_schedule and not given else "none"
    if config.match != "none" and not has_schedule:
        raise ScheduleError(f"--match {config.match} needs a --schedule whose {config.match} the reducers match")
    if config.match != "none" and given:
        raise SettingError(f"--match {config.match} sets every reducer's amount: leave out {', '.join(given)}")
    return config.match
