"""A(n) for the policy: read from `--accuracy-curve`, or measured on the `--dataset-root` sample with random
pruning after embedding (`pomt.choice.accuracy`) and written beside the other outputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pomt.choice import accuracy as acc
from pomt.measurement.steps import Step
from pomt.pipelines.offline.config import OfflineConfig
from pomt.pipelines.offline.prepare import Run
from pomt.workload.prepare import Workload


def given_accuracy(config: OfflineConfig, run: Run) -> acc.AccuracyCurve | None:
    """The curve `--accuracy-curve` names, checked against the model's token range; None without one."""
    if config.accuracy_curve is None:
        return None
    return acc.load_accuracy_curve(config.accuracy_curve, (run.geometry.min_tokens, run.geometry.num_tokens))


def estimate_accuracy(workload: Workload, config: OfflineConfig, run: Run,
                      steps: Sequence[Step] = ()) -> tuple[acc.AccuracyCurve, Path]:
    """A(n) on a seeded, bounded sample of the dataset folder (at evenly spread counts and both sides of each
    step), with random pruning after embedding, and the `<stem>.accuracy.csv` it is written to."""
    model, geometry = run.prepared.model, run.geometry
    extra = [s.tokens for s in steps] + [s.upper_tokens for s in steps]
    dataset, kind = acc.open_image_folder(config.dataset_root, acc.eval_transform(model, geometry.input_size))
    subset = acc.seeded_subset(dataset, config.accuracy_samples, workload.seed)
    counts = acc.accuracy_token_counts(geometry.min_tokens, geometry.num_tokens, config.accuracy_points, extra)
    loader = acc.image_loader(subset, config.accuracy_batch_size)
    device = run.setup.device if run.replay is None else "cpu"
    curve = acc.measure_accuracy(model, loader, counts, kind, device=device, seed=workload.seed,
                                 progress=workload.progress)
    return curve, acc.save_accuracy_curve(Path(workload.output_dir) / f"{run.setup.stem}.accuracy.csv", curve)
