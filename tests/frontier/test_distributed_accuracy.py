"""Accuracy computed by torchrun ranks together (gloo on the CPU) is the single process's, bit for bit, on every
rank, stop rules and the unpruned model's classes found together included; ranks that hold other images fail alike
with one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import Dataset

from pomt.accuracy import image_loader
from pomt.frontier.calibration import NONE, Classifier, count_correct, image_outcomes, unpruned_classes
from pomt.frontier.distributed import Ranks, check_same_images, join_from_env, ranks, sharded_classes, sharded_counts

from support import sharded_accuracy_run as job
from support.sharded_accuracy_run import BATCH, CANDIDATES, GIVEN, STOPS, build, errors, report

SCRIPT = Path(job.__file__)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(out: Path, *args: str, size: int = 2) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(size),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT), str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def as_torchrun_starts(out: Path, *args: str, size: int = 2) -> list[subprocess.CompletedProcess]:
    """The ranks started with torchrun's environment by this process, which sees each one's exit code (torchrun
    stops the others once one has exited)."""
    port = str(free_port())
    started = []
    for rank in range(size):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "WORLD_SIZE": str(size), "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(size)}
        started.append(subprocess.Popen([sys.executable, str(SCRIPT), str(out), *args], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    finished = [(rank, *rank.communicate(timeout=300)) for rank in started]
    return [subprocess.CompletedProcess(rank.args, rank.returncode, out, err) for rank, out, err in finished]


def counted_alone(classifier: Classifier, images: Dataset, stop) -> dict:
    return count_correct(classifier, CANDIDATES, image_loader(images, BATCH), stop)


def single_process() -> str:
    classifier, dataset = build()
    counts = {rule: counted_alone(classifier, dataset, stop) for rule, stop in STOPS.items()}
    counts |= {rule + GIVEN: found for rule, found in counts.items()}  # the same counts without the unpruned model
    outcomes = {rule: image_outcomes(classifier, CANDIDATES, image_loader(dataset, BATCH), stop)
                for rule, stop in STOPS.items()}
    classes = unpruned_classes(classifier, image_loader(dataset, BATCH))
    return report(classes, counts, outcomes, errors(partial(counted_alone, classifier), dataset))


def test_two_ranks_give_every_rank_the_single_process_result(tmp_path):
    done = torchrun(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    alone = single_process()
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.json").read_text() == alone, f"rank {rank}"


def test_the_case_stops_mid_round_and_meets_an_error_on_one_rank():
    """What the comparison above covers: stops after a rank-1 and a rank-0 batch, a pass ended mid-round, and an
    error in a batch of rank 0 only, met (by every rank) or not reached."""
    classifier, dataset = build()
    lost = counted_alone(classifier, dataset, STOPS["lost"])
    assert sorted(p.trials for p in lost.values()) == [16, 40, len(dataset)]
    dropped = image_outcomes(classifier, CANDIDATES, image_loader(dataset, BATCH), STOPS["drop"])
    assert {len(right) for right in dropped.values()} == {BATCH}  # the unpruned model's too: the pass ended
    met = errors(partial(counted_alone, classifier), dataset)
    assert met["drop"] is None and "more classes than the model's 5 outputs" in met["none"]


def test_ranks_with_other_images_fail_alike_with_one_line(tmp_path):
    for done in as_torchrun_starts(tmp_path, "--other-images"):
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("rank 1 sees other calibration images than rank 0: held_out 'held_out:top1:")
        assert done.stderr.endswith("; give every rank the same images\n") and done.stderr.count("\n") == 1
    assert not list(tmp_path.glob("rank*.json"))


def test_one_process_is_rank_zero_of_one_and_computes_alone():
    assert ranks() == join_from_env("cpu") == Ranks(0, 1, None)
    check_same_images({"search": "anything"})  # nothing to compare with
    classifier, dataset = build()
    found = sharded_counts(classifier, CANDIDATES, dataset, BATCH, STOPS["lost"])
    assert found == counted_alone(classifier, dataset, STOPS["lost"])
    classes = sharded_classes(classifier, dataset, BATCH)
    assert torch.equal(classes, unpruned_classes(classifier, image_loader(dataset, BATCH)))
    assert sharded_counts(classifier, CANDIDATES, dataset, BATCH, STOPS["lost"], unpruned=classes) == found
    assert NONE not in found and not torch.distributed.is_initialized()
