"""Stage 1, configure: what the offline computation is asked to do besides measuring, and its checks and limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pomt.accuracy import load_accuracy_curve
from pomt.checks import METHODS, check_method, check_options, check_prune_block
from pomt.errors import DatasetError, GridError, PolicyError, SettingError
from pomt.frontier.certify import FINALISTS
from pomt.frontier.search import MAX_EVALS
from pomt.measurement.search import SearchSettings
from pomt.models.geometry import Geometry
from pomt.options import ADVANCED, CHOICE, MEASUREMENT, OUTPUTS, VERIFICATION, WORKLOAD, option
from pomt.policies import POLICIES
from pomt.verification.verify import verify_rounds
from pomt.workload.prepare import Workload

SEARCHES = ("adaptive", "full")
FRONTIER = "frontier"
OFFLINE_POLICIES = (FRONTIER, *POLICIES)
DEFAULT_DROP = 1.0  # points: the frontier's default --max-accuracy-drop
SAMPLE_CAP = 5_000  # images: the default calibration sample, where a folder holds more (its search split resolves
# a paired drop of about 0.15 points at 95%)
BLIND_SHARE = 0.25  # of the patch tokens: the most a schedule removes by default when accuracy is unknown


@dataclass(frozen=True)
class OfflineConfig:
    """What the offline computation does with a workload besides measuring it; each field is also a CLI option."""

    search: str = option("adaptive", "Coarse grid refined at candidate steps (adaptive), or every count.",
                         choices=SEARCHES, panel=MEASUREMENT)
    replay: Path | None = option(None, "Analyse a recorded trace (CSV with its JSON sidecar) instead of measuring; "
                                       "model, batch and input size are the trace's.", panel=WORKLOAD)
    dataset_root: Path | None = option(
        None, "ImageFolder for accuracy (top-1), or a folder of images (agreement with the unpruned model).",
        panel=CHOICE)
    checkpoint: Path | None = option(None, "Local checkpoint (state dict or timm file).", panel=WORKLOAD)
    pretrained: bool | None = option(
        None, "Pretrained weights (default: only when accuracy is measured and no checkpoint is given).",
        negatable=True, panel=WORKLOAD)
    agreement: bool = option(False, "Measure A(n) as agreement with the unpruned model, the folder's labels "
                                    "ignored (for images whose classes are not the model's).", panel=CHOICE)
    accuracy_samples: int | None = option(
        None, f"Images in the seeded calibration sample (default: the whole folder, at most {SAMPLE_CAP:,}).", min=1,
        panel=CHOICE)
    accuracy_points: int = option(12, "Token counts at which A(n) is measured.", min=2, panel=ADVANCED)
    accuracy_batch_size: int = option(32, "Images per forward while measuring accuracy.", min=1, panel=ADVANCED)
    alpha: float = option(0.5, "Utility weight of latency against accuracy.", min=0, max=1, panel=ADVANCED)
    policy: str | None = option(
        None, "Default: frontier with --dataset-root (the fastest verified schedule across blocks and reducers "
              "within --max-accuracy-drop), else budget with a budget, utility with an accuracy curve, else step.",
        choices=OFFLINE_POLICIES, panel=CHOICE)
    max_accuracy_drop: float | None = option(
        None, "Frontier: most accuracy the schedule may lose against the unpruned model, in points (default 1.0).",
        min=0, panel=CHOICE)
    accuracy_confidence: float = option(
        0.95, "Frontier: confidence that the shipped schedule's drop is within --max-accuracy-drop, certified on "
              "the held-out images with the error shared among the finalists (--min-accuracy is judged at it on "
              "the search split).", min=0.5, max=0.999, panel=CHOICE)
    max_evals: int = option(MAX_EVALS, "Frontier: schedules whose accuracy the search may measure on the search split.",
                            min=1, panel=ADVANCED)
    held_out: float | None = option(
        None, "Frontier: share of the calibration images held out to certify the finalists on (default: two thirds, "
              "the search exploring on the other third).", min=0.05,
        max=0.95, panel=ADVANCED)
    accuracy_cache: Path | None = option(
        None, "Frontier: the SQLite file of measured accuracies, shared by runs, ranks and devices (default: "
              "<output-dir>/cache/accuracy/<model>-<weights>.sqlite).", panel=ADVANCED)
    finalists: int = option(FINALISTS, "Frontier: schedules the search split passes that are certified on the "
                                       "held-out images and verified (the error is shared among them).", min=1,
                            max=12, panel=CHOICE)
    latency_budget_ms: float | None = option(None, "Latency the schedule must meet (ms, > 0).", min=0, panel=CHOICE)
    min_accuracy: float | None = option(None, "Lowest acceptable A(n), in [0, 1].", min=0, max=1, panel=CHOICE)
    max_remove: int | None = option(None, "Most tokens the schedule may remove (default: all but one with an "
                                          "accuracy estimate; a quarter of the patch tokens without one, since "
                                          "pruning more would be a guess about accuracy, not latency).", min=0,
                                    panel=CHOICE)
    min_gain: float = option(0.03, "Least speedup (fraction) worth pruning for, predicted and measured.", min=0,
                             max=1, panel=CHOICE)
    prune_block: int = option(3, "Block (0-based) where tokens are removed.", min=0, panel=CHOICE)
    method: str = option("pomt", "Reducer the schedule is applied with.", choices=METHODS, panel=CHOICE)
    verify: bool = option(True, "Measure the patched model against the unpruned one before shipping.",
                          negatable=True, panel=VERIFICATION)
    verify_rounds: int = option(10, "Rounds of the verification (every candidate once per round).", min=3,
                                panel=VERIFICATION)
    verify_seconds: float = option(15.0, "Seconds the verification's rounds should fill: where rounds are shorter, "
                                         "more than --verify-rounds (at most four times as many), here and in "
                                         "the fresh process.", min=0, panel=VERIFICATION)
    verify_candidates: int = option(2, "Best-ranked removals verified (plus the other side of a targeted step; "
                                       "with the frontier, plus each reducer's best and the best uniform "
                                       "schedule).", min=1, panel=VERIFICATION)
    verify_fresh: bool = option(True, "Measure the confirmed steps within reach, and the removals that qualified, "
                                      "once more in a fresh process (a step near N can sit elsewhere there); "
                                      "keep only what holds in both.", negatable=True, panel=VERIFICATION)
    latency_only: bool = option(False, "Measure latency only (no accuracy).", panel=OUTPUTS)
    accuracy_only: bool = option(False, "Estimate accuracy only; write its CSV.", panel=OUTPUTS)
    verbose: bool = option(False, "Print every step, rejected candidate, verified variant, note and file.",
                           panel=OUTPUTS)
    accuracy_curve: Path | None = option(None, "Accuracy CSV from an --accuracy-only run.", panel=CHOICE)

    def rounds_for(self, forward_ms: float, reps: int, variants: int) -> int:
        """Rounds of a verification of `variants` (the unpruned model included) of `reps` forwards of about
        `forward_ms`: `--verify-rounds`, more where they would not fill `--verify-seconds`."""
        return verify_rounds(self.verify_rounds, self.verify_seconds, forward_ms, reps, variants)

    def check(self) -> OfflineConfig:
        """Raise for settings no run can honour, before anything is resolved or built."""
        check_method(self.method)
        if self.search not in SEARCHES:
            raise GridError(f"unknown search {self.search!r}; choose one of {', '.join(SEARCHES)}")
        if self.policy is not None and self.policy not in OFFLINE_POLICIES:
            raise PolicyError(f"unknown policy {self.policy!r}; choose one of {', '.join(OFFLINE_POLICIES)}")
        check_options(self)
        if self.latency_only and self.accuracy_only:
            raise PolicyError("--latency-only and --accuracy-only exclude each other")
        if self.replay is not None and self.accuracy_only:
            raise PolicyError("--replay analyses latency; --accuracy-only measures none")
        if self.accuracy_only and self.dataset_root is None:
            raise PolicyError("--accuracy-only needs --dataset-root")
        if self.dataset_root is not None and (self.latency_only or self.accuracy_curve is not None):
            unused = "--latency-only measures no accuracy" if self.latency_only else "--accuracy-curve gives A(n)"
            raise SettingError(f"{unused}: --dataset-root would go unused; leave one out")
        if self.accuracy_curve is not None:  # read now, its token range checked once the model is known
            load_accuracy_curve(self.accuracy_curve)
        if self.dataset_root is not None and not Path(self.dataset_root).is_dir():
            raise DatasetError(f"dataset folder not found: {self.dataset_root}")
        if self.agreement and self.dataset_root is None:
            raise DatasetError("--agreement measures A(n) on --dataset-root: give one")
        if self.latency_budget_ms is not None and not self.latency_budget_ms > 0:
            raise SettingError(f"--latency-budget-ms must be positive, got {self.latency_budget_ms:g}")
        if self.max_accuracy_drop is not None and not self.max_accuracy_drop > 0:
            raise SettingError(f"--max-accuracy-drop must be positive, got {self.max_accuracy_drop:g}")
        if self.policy == FRONTIER and not needs_accuracy_model(self):
            raise PolicyError("the frontier policy measures each schedule's accuracy: give --dataset-root "
                              "(without --latency-only or --accuracy-curve)")
        if self.policy == "budget" and self.latency_budget_ms is None:
            raise PolicyError("the budget policy needs --latency-budget-ms")
        known = self.accuracy_curve is not None or needs_accuracy_model(self)
        if not known and not self.accuracy_only:
            needs = "the utility policy" if self.policy == "utility" else \
                "--min-accuracy" if self.min_accuracy is not None else None
            if needs:
                raise PolicyError(f"{needs} needs accuracy: give --dataset-root (without --latency-only) or "
                                  "--accuracy-curve")
        return self


@dataclass(frozen=True)
class Request:
    """What a run is asked: the workload measured, the offline configuration, the search's settings."""

    workload: Workload
    config: OfflineConfig
    settings: SearchSettings


def validate(config: OfflineConfig, settings: SearchSettings) -> None:
    """Reject bad settings before anything is resolved or built (`check_pruning` checks the rest)."""
    config.check()
    settings.check()


def check_pruning(config: OfflineConfig, geometry: Geometry) -> None:
    """The pruning block and the removal limit, against the model."""
    check_prune_block(config.prune_block, geometry.depth, "--prune-block")
    most = geometry.patch_tokens // 2 if config.method == "tome" else geometry.patch_tokens - 1
    if config.max_remove is not None and not 0 <= config.max_remove <= most:
        why = " (ToMe merges at most half the patch tokens at a block)" if config.method == "tome" else ""
        raise GridError(f"--max-remove {config.max_remove} is outside [0, {most}]{why}")


def max_remove(config: OfflineConfig, geometry: Geometry, accuracy_known: bool) -> int:
    """The most tokens a schedule may remove: the setting, else all but one patch token when accuracy is known,
    else a quarter of the patch tokens (`BLIND_SHARE`)."""
    if config.max_remove is not None:
        return config.max_remove
    limit = geometry.patch_tokens - 1 if accuracy_known else int(BLIND_SHARE * geometry.patch_tokens)
    return min(limit, geometry.patch_tokens // 2) if config.method == "tome" else limit


def needs_accuracy_model(config: OfflineConfig) -> bool:
    """Whether this run measures A(n) itself (a dataset, latency wanted too, no accuracy curve given)."""
    return config.dataset_root is not None and not config.latency_only and config.accuracy_curve is None


def policy_name(config: OfflineConfig, accuracy_known: bool) -> str:
    """The policy asked for, else frontier with a dataset, budget with a budget, utility with accuracy, else step."""
    return config.policy or (FRONTIER if needs_accuracy_model(config) else
                             "budget" if config.latency_budget_ms is not None else
                             "utility" if accuracy_known else "step")


def max_accuracy_drop(config: OfflineConfig) -> float:
    """The frontier's drop limit in points: the setting, else `DEFAULT_DROP`."""
    return DEFAULT_DROP if config.max_accuracy_drop is None else config.max_accuracy_drop


def sample_size(config: OfflineConfig, available: int) -> int:
    """Images in the calibration sample: `--accuracy-samples`, else the whole folder up to `SAMPLE_CAP`."""
    return min(available, config.accuracy_samples or SAMPLE_CAP)
