"""Candidates evaluated together, sharing the unpruned prefix, give exactly what each patched model gives."""

import pytest
import torch

from pomt.errors import DatasetError
from pomt.frontier.calibration import candidate_logits, count_correct, image_outcomes, shares_prefix
from pomt.frontier.candidates import NONE, Candidate
from pomt.models.registry import create_model
from pomt.patching import patch, patch_state, unpatch
from pomt.stats import Proportion

CANDIDATES = [Candidate.of(method, removal) for method in ("pomt", "topk", "tome", "l2norm")
              for removal in ({0: 3}, {2: 4, 4: 2}, {5: 3}, {1: 2, 2: 2, 3: 2, 4: 2})] + [Candidate.of("pomt", {})]


@pytest.fixture(scope="module")
def model():
    return create_model("test_vit", 64, num_classes=10)  # 17 tokens, 6 blocks, seeded random weights


def own_logits(model, candidate, images):
    if not candidate.unpruned:
        patch(model, candidate.method, candidate.as_dict())
    try:
        return model(images)
    finally:
        unpatch(model)


@pytest.mark.parametrize("avg_pool", [False, True])
def test_shared_prefix_logits_equal_each_patched_models_own_exactly(model, avg_pool):
    if avg_pool:  # ToMe then also weights the pooling by token size
        model = create_model("test_vit", 64, num_classes=10)
        model.global_pool = "avg"
    images = torch.randn(5, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    assert shares_prefix(model)
    with torch.inference_mode():
        shared = candidate_logits(model, CANDIDATES, images)
        for candidate in CANDIDATES:
            assert torch.equal(shared[candidate], own_logits(model, candidate, images)), candidate.key
    assert patch_state(model) is None  # left unpatched


def test_without_sharing_every_candidate_runs_its_own_forward(model):
    images = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        shared = candidate_logits(model, CANDIDATES, images, share=True)
        alone = candidate_logits(model, CANDIDATES, images, share=False)
    assert all(torch.equal(shared[c], alone[c]) for c in CANDIDATES)


def test_counts_against_labels_or_against_the_unpruned_model(model):
    images = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        unpruned = model(images).argmax(-1)
    batches = [(images[:5], unpruned[:5]), (images[5:], unpruned[5:])]
    labelled = count_correct(model, CANDIDATES, batches, agreement=False)
    agreeing = count_correct(model, CANDIDATES, batches, agreement=True)
    assert labelled == agreeing  # labels that are the unpruned top-1: the same counts
    assert agreeing[NONE] == Proportion(8, 8, lost=0, gained=0)
    for candidate in CANDIDATES:  # against the unpruned model: only lost, and what it lost is what it missed
        assert agreeing[candidate].trials == 8 and agreeing[candidate].gained == 0
        assert agreeing[candidate].lost == 8 - agreeing[candidate].successes


def test_a_candidate_that_stop_accepts_is_measured_no_further(model):
    images = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    labels = torch.arange(8) % 10
    batches = [(images[:5], labels[:5]), (images[5:], labels[5:])]
    stopping = CANDIDATES[0]
    counted = count_correct(model, CANDIDATES, batches, agreement=False,
                            stop=lambda p, seen=[]: seen.append(p) or len(seen) == 1)  # the first asked stops
    first = count_correct(model, CANDIDATES, batches[:1], agreement=False)
    full = count_correct(model, CANDIDATES, batches, agreement=False)
    assert counted[stopping] == first[stopping] and counted[stopping].trials == 5  # its counts on the first batch
    assert all(counted[c] == full[c] for c in CANDIDATES[1:])  # the others: every image
    assert counted[NONE] == full[NONE]  # the unpruned model is never stopped
    outcomes = image_outcomes(model, [stopping], batches, agreement=False, stop=lambda p: True)
    assert len(outcomes[stopping]) == len(outcomes[NONE]) == 5  # all asked for stopped: so did the pass


def test_what_a_candidate_lost_and_gained_is_counted_image_by_image(model):
    images = torch.randn(12, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    labels = torch.arange(12) % 10
    counted = count_correct(model, CANDIDATES, [(images, labels)], agreement=False)
    with torch.inference_mode():
        logits = candidate_logits(model, [NONE, *CANDIDATES], images)
    reference = logits[NONE].argmax(-1) == labels
    for candidate in CANDIDATES:
        right = logits[candidate].argmax(-1) == labels
        assert counted[candidate] == Proportion(int(right.sum()), 12, int((reference & ~right).sum()),
                                                int((right & ~reference).sum()))


def test_labels_beyond_the_models_classes_are_a_dataset_error(model):
    with pytest.raises(DatasetError, match="more classes than the model's 10 outputs"):
        count_correct(model, CANDIDATES[:1], [(torch.randn(2, 3, 64, 64), torch.tensor([3, 12]))], agreement=False)
