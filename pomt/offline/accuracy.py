"""A(n) for the policy: read from `--accuracy-curve`, or measured on the `--dataset-root` sample with random
pruning after embedding (`pomt.accuracy`); the sample is opened, and its labels checked against the
model's classifier, before anything is measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn
from torch.utils.data import Dataset

from pomt import accuracy as acc
from pomt.measurement.steps import Step
from pomt.offline.config import OfflineConfig, needs_accuracy_model
from pomt.offline.prepare import Run
from pomt.verification.fresh import FreshWorker
from pomt.workload.prepare import Workload

Sample = tuple[Dataset, str]  # the seeded sample of the dataset folder, and its kind (top-1 or agreement)


def given_accuracy(config: OfflineConfig, run: Run) -> acc.AccuracyCurve | None:
    """The curve `--accuracy-curve` names, checked against the model's token range; None without one."""
    if config.accuracy_curve is None:
        return None
    return acc.load_accuracy_curve(config.accuracy_curve, (run.geometry.min_tokens, run.geometry.num_tokens))


def accuracy_sample(workload: Workload, config: OfflineConfig, run: Run) -> Sample | None:
    """The seeded sample A(n) is measured on, its labels checked against the model's classifier
    (`pomt.accuracy.check_labels`; `--agreement` needs none); None where this run measures no A(n)."""
    if not (needs_accuracy_model(config) or config.accuracy_only) or config.dataset_root is None:
        return None
    model, geometry = run.prepared.model, run.geometry
    transform = acc.eval_transform(model, geometry.input_size)
    dataset, kind = acc.open_image_folder(config.dataset_root, transform, agreement=config.agreement)
    acc.check_labels(dataset, kind, model, config.dataset_root)
    return acc.seeded_subset(dataset, config.accuracy_samples, workload.seed), kind


def estimate_accuracy(workload: Workload, config: OfflineConfig, run: Run, sample: Sample,
                      steps: Sequence[Step] = ()) -> acc.AccuracyCurve:
    """A(n) on the sample (at evenly spread counts and both sides of each step), with random pruning after
    embedding."""
    geometry, (subset, kind) = run.geometry, sample
    extra = [s.tokens for s in steps] + [s.upper_tokens for s in steps]
    counts = acc.accuracy_token_counts(geometry.min_tokens, geometry.num_tokens, config.accuracy_points, extra)
    device = run.setup.device if run.replay is None else "cpu"
    job = AccuracyJob(run.prepared.model, subset, config.accuracy_batch_size, counts, kind, device, workload.seed,
                      workload.progress)
    with FreshWorker() as worker:  # not in the timing process (`pomt.frontier.calibration`)
        return worker.run_copied(_measure_there, job)


@dataclass(frozen=True)
class AccuracyJob:
    """What the worker measuring A(n) needs: the model, the sample, the counts and how."""

    model: nn.Module
    sample: Dataset
    batch_size: int
    counts: list[int]
    kind: str
    device: str
    seed: int
    progress: bool


def _measure_there(job: AccuracyJob) -> acc.AccuracyCurve:
    return acc.measure_accuracy(job.model, acc.image_loader(job.sample, job.batch_size), job.counts, job.kind,
                                device=job.device, seed=job.seed, progress=job.progress)
