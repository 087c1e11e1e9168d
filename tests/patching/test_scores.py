"""Scoring and selection on plain tensors (ToMe matching: test_tome.py)."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from pomt.patching.attention import (
    attention_received,
    best_indices,
    class_attention_scores,
    gather_kept,
    keep_and_fuse,
    pomt_scores,
    split_best,
)


def test_split_best_keeps_highest_in_original_order_and_drops_the_rest():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.2]])
    kept, dropped = split_best(scores, 3)
    assert kept.tolist() == [[1, 2, 3]]
    assert sorted(dropped.tolist()[0]) == [0, 4]
    assert best_indices(scores, 3).tolist() == [[1, 2, 3]]


def test_split_best_breaks_ties_by_the_lower_index():
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.5, 0.1, 0.5]])
    kept, dropped = split_best(scores, 3)
    assert kept.tolist() == [[0, 1, 2]]
    assert dropped.tolist() == [[3, 5, 4]]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # dynamo=False: the legacy TorchScript exporter
def test_split_best_exports_to_onnx_with_the_same_tie_breaking():
    """ONNX has no stable sort: the export path must give what the stable sort gives, ties included."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")

    class Split(torch.nn.Module):
        def forward(self, scores):
            kept, dropped = split_best(scores, 20)
            return torch.cat([kept, dropped], dim=1)

    scores = torch.randint(0, 4, (3, 48), generator=torch.Generator().manual_seed(0)).float()
    split = Split().eval()
    expected = split(scores)
    for dynamo in (False, True):
        path = io.BytesIO()
        with contextlib.redirect_stdout(io.StringIO()):
            program = torch.onnx.export(split, (scores,), None if dynamo else path, dynamo=dynamo)
        model = program.model_proto.SerializeToString() if dynamo else path.getvalue()
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {session.get_inputs()[0].name: scores.numpy()})
        assert torch.equal(torch.from_numpy(got), expected), f"dynamo={dynamo}"


def test_keep_and_fuse_layout():
    x = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3)
    kept = torch.tensor([[0, 3], [1, 2]])
    dropped = torch.tensor([[1, 2, 4], [0, 3, 4]])
    out = keep_and_fuse(x, 1, kept, dropped)
    assert out.shape == (2, 4, 3)
    assert torch.equal(out[:, 0], x[:, 0])
    assert torch.equal(out[0, 1:3], x[0, [1, 4]])
    assert torch.allclose(out[0, 3], x[0, [2, 3, 5]].mean(0))
    assert torch.allclose(out[1, 3], x[1, [1, 4, 5]].mean(0))
    assert torch.equal(gather_kept(x, 2, kept)[1, 2:], x[1, [3, 4]])
    assert torch.equal(keep_and_fuse(x[1:], 1, kept[1:], dropped[1:]), out[1:])  # batch 1 takes its own path
    assert torch.equal(gather_kept(x[1:], 2, kept[1:]), gather_kept(x, 2, kept)[1:])


def test_pomt_scores_follow_the_definition():
    torch.manual_seed(0)
    batch, heads, tokens, prefix = 2, 3, 7, 2
    probs = torch.randn(batch, heads, tokens, tokens).softmax(-1)
    v = torch.randn(batch, heads, tokens, 4)
    got = pomt_scores(attention_received(probs, prefix), v, prefix)
    in_chunks = sum(attention_received(probs[:, :, r : r + 3], prefix, r) for r in range(0, tokens, 3))
    assert torch.allclose(pomt_scores(in_chunks, v, prefix), got, atol=1e-6)
    for b in range(batch):
        received = [
            sum(max(probs[b, h, i, j].item() for h in range(heads)) for i in range(prefix, tokens))
            for j in range(prefix, tokens)
        ]
        top = max(received)
        sums = [sum(max(v[b, h, t, f].item() for h in range(heads)) for f in range(4)) for t in range(tokens)]
        magnitude = torch.tensor(sums).softmax(0)[prefix:]
        expected = torch.tensor(received) / top + magnitude
        assert torch.allclose(got[b], expected, atol=1e-5)


def test_class_attention_scores_mean_over_heads_of_row_zero():
    probs = torch.rand(1, 2, 5, 5)
    got = class_attention_scores(probs[:, :, :1], 1)
    assert torch.allclose(got, probs[:, :, 0, 1:].mean(1))
