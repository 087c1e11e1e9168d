"""Patches on real timm and DINOv2 models: token counts, prefix tokens, exactness, validation."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import warnings

import pytest
import timm
import torch

from pomt.checks import check_method
from pomt.deploy.apply import UnverifiedScheduleWarning, apply_schedule
from pomt.device import Fingerprint
from pomt.device.allocator import ALLOCATOR_ENV, STEADY
from pomt.errors import PatchError, ScheduleError
from pomt.formats.schedule import BlockRemoval, Schedule
from pomt.formats.schedule_parts import Verified
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.patching import METHODS, attention, patch, patch_state, patched, token_counts, unpatch
from pomt.patching.api import resolve_removal
from pomt.patching.attention import call_layer

from conftest import verified_record

PRUNE = {3: 56, 6: 20}


def _timm(name: str, **kwargs) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False, **kwargs).eval()


def _dinov2_authors() -> torch.nn.Module:
    from dinov2.models.vision_transformer import vit_small

    return vit_small(patch_size=14, img_size=224).eval()


MODELS = {
    "deit_small": lambda: _timm("deit_small_patch16_224"),
    "deit_small_distilled": lambda: _timm("deit_small_distilled_patch16_224"),
    "dinov2_reg4": lambda: _timm("vit_small_patch14_reg4_dinov2", img_size=224),
    "dinov2_authors": _dinov2_authors,
}


class _Models(dict):
    """Each model built (seeded) when a test first asks for it: a test needs only its own, and without the
    DINOv2 authors' package (`make install` brings it) only the tests of that model skip."""

    def __missing__(self, name: str) -> torch.nn.Module:
        if name == "dinov2_authors":
            pytest.importorskip("dinov2", reason="the DINOv2 authors' package is not installed")
        torch.manual_seed(0)
        self[name] = MODELS[name]()
        return self[name]


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return _Models()


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    return torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))


def _counts_and_outputs(model: torch.nn.Module, x: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """Token count entering each block, and each block's output."""
    counts, outputs, handles = [], [], []
    for block in transformer_blocks(model):
        handles.append(block.register_forward_pre_hook(lambda _m, args: counts.append(args[0].shape[1])))
        handles.append(block.register_forward_hook(lambda _m, _a, out: outputs.append(out)))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return counts, outputs


@pytest.mark.parametrize("name", list(MODELS))
def test_token_counts_and_prefix_rows_match_the_plan(models, image, name):
    model = models[name]
    geometry = model_geometry(model)
    prefix = geometry.prefix_tokens
    _, reference = _counts_and_outputs(model, image)
    for method in METHODS:
        prune = 40 if method == "tome" else PRUNE
        patch(model, method, prune)
        try:
            counts, outputs = _counts_and_outputs(model, image)
        finally:
            unpatch(model)
        removal = {b: 40 for b in range(geometry.depth)} if method == "tome" else PRUNE
        expected = token_counts(geometry.num_tokens, prefix, geometry.depth, method, removal)
        assert counts == expected[:-1], method
        assert outputs[-1].shape[1] == expected[-1], method
        first = min(removal)
        got, want = outputs[first][:, :prefix], reference[first][:, :prefix]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_tome_merges_at_most_half_per_block(models, image):
    model = models["deit_small"]
    patch(model, "tome", 150)
    try:
        counts, _ = _counts_and_outputs(model, image)
    finally:
        unpatch(model)
    assert counts[:4] == [197, 99, 50, 26]


def _pruning_block_parts(model, x, block_index):
    """Input of block `block_index` in the unpatched model, its attention pieces, and the mid-block x."""
    blocks = transformer_blocks(model)
    captured = {}
    handle = blocks[block_index].register_forward_pre_hook(lambda _m, args: captured.setdefault("x", args[0]))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    block, tokens = blocks[block_index], captured["x"]
    with torch.no_grad():
        y = block.norm1(tokens)
        batch, n, channels = y.shape
        heads = block.attn.num_heads
        qkv = torch.nn.functional.linear(y, block.attn.qkv.weight, block.attn.qkv.bias)
        q, k, v = qkv.view(batch, n, 3, heads, channels // heads).unbind(2)  # (B, N, H, d)
        logits = torch.einsum("bihd,bjhd->bhij", q, k) / (channels // heads) ** 0.5
        probs = logits.softmax(-1)
        mid = tokens + block.ls1(block.attn(y))
    return block, probs, v.permute(0, 2, 1, 3), mid


def _finish_block(block, tokens):
    with torch.no_grad():
        return tokens + block.ls2(block.mlp(block.norm2(tokens)))


def _block_output(model, x, block_index):
    _, outputs = _counts_and_outputs(model, x)
    return outputs[block_index]


@pytest.mark.parametrize(("name", "probs_bytes"), [("deit_small", None), ("dinov2_reg4", None),
                                                   ("dinov2_reg4", 1), ("deit_small", 20_000)])
def test_pomt_fuses_the_mean_of_the_discarded_tokens(models, name, probs_bytes, monkeypatch):
    """The whole attention matrix at once, and in chunks of query rows (1 byte: one row at a time, the
    first rows prefix tokens; 20 kB: 3 rows of deit_small's 2 x 6 x 197 keys): the same tokens, the same
    output, as the definition computed here on the whole matrix."""
    if probs_bytes is not None:
        monkeypatch.setattr(attention, "PROBS_BYTES", probs_bytes)
    model, remove, at = models[name], 30, 3
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    prefix = model_geometry(model).prefix_tokens
    block, probs, v, mid = _pruning_block_parts(model, x, at)
    patch(model, "pomt", {at: remove})
    try:
        got = _block_output(model, x, at)
    finally:
        unpatch(model)
    for b in range(x.shape[0]):
        patch_probs = probs[b, :, prefix:, prefix:]
        received = patch_probs.max(dim=0).values.sum(dim=0)
        received = received / received.max()
        magnitude = torch.softmax(v[b].max(dim=0).values.sum(dim=1), dim=0)[prefix:]
        order = torch.argsort(received + magnitude, descending=True)
        keep = mid.shape[1] - prefix - remove - 1
        kept, discarded = order[:keep].sort().values, order[keep:]
        assert discarded.numel() == remove + 1
        fused = mid[b, prefix + discarded].mean(0, keepdim=True)
        tokens = torch.cat([mid[b, :prefix], mid[b, prefix + kept], fused])
        expected = _finish_block(block, tokens[None])[0]
        torch.testing.assert_close(got[b], expected, atol=1e-4, rtol=1e-4)


def _queries(batch: int, tokens: int, device: str) -> torch.Tensor:
    """deit_base's queries (B, 12, N, 64) in float16, without their memory (expanded, or on meta)."""
    return torch.empty((), dtype=torch.float16, device=device).expand(batch, 12, tokens, 64)


def test_a_gpu_chunk_holds_as_much_as_the_mlp_activation_and_the_cpu_16_mb():
    """A meta tensor stands for a GPU's: there a chunk may take a (B, N, 4C) activation's bytes, 256 query
    rows of 64-dimensional heads (deit_base at batch 64 and 448 px: 4 chunks, not the CPU's 61 of 13 rows);
    at 224 px the whole matrix is one chunk; small workloads get at least the CPU's budget."""
    cpu, gpu = _queries(64, 785, "cpu"), _queries(64, 785, "meta")
    assert attention.probs_budget(cpu) == attention.PROBS_BYTES
    assert len(attention.query_chunks(cpu, 785)) == 61
    assert attention.probs_budget(gpu) == 64 * 785 * 4 * 768 * 2
    chunks = attention.query_chunks(gpu, 785)
    assert len(chunks) == 4 and max(stop - start for start, stop in chunks) == 256
    assert chunks[0][0] == 0 and chunks[-1][1] == 785
    assert attention.query_chunks(_queries(64, 197, "meta"), 197) == [(0, 197)]
    assert attention.probs_budget(_queries(1, 197, "meta")) == attention.PROBS_BYTES


def test_chunked_for_a_device_overrides_the_tensors_own_and_is_restored():
    """An export traced on the CPU for a GPU runtime chunks as the GPU would, and the reverse; outside the
    context each tensor's own device decides again, nested contexts included."""
    cpu, gpu = _queries(64, 785, "cpu"), _queries(64, 785, "meta")
    with attention.chunked_for("cuda"):
        assert len(attention.query_chunks(cpu, 785)) == 4
        with attention.chunked_for("cpu"):
            assert len(attention.query_chunks(gpu, 785)) == 61
        assert len(attention.query_chunks(cpu, 785)) == 4
    assert len(attention.query_chunks(cpu, 785)) == 61
    assert len(attention.query_chunks(gpu, 785)) == 4


def test_topk_keeps_exactly_the_most_attended_tokens(models):
    model, remove, at = models["deit_small_distilled"], 50, 2
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    block, probs, _, mid = _pruning_block_parts(model, x, at)
    patch(model, "topk", {at: remove})
    try:
        got = _block_output(model, x, at)
    finally:
        unpatch(model)
    for b in range(x.shape[0]):
        cls_attention = probs[b, :, 0, 2:].mean(dim=0)
        kept = torch.argsort(cls_attention, descending=True)[: cls_attention.numel() - remove].sort().values
        expected = _finish_block(block, torch.cat([mid[b, :2], mid[b, 2 + kept]])[None])[0]
        torch.testing.assert_close(got[b], expected, atol=1e-4, rtol=1e-4)


def test_l2norm_and_random_keep_the_expected_subsets(models, image):
    model, at = models["deit_small"], 1
    _, _, _, mid = _pruning_block_parts(model, image, at)
    patch(model, "l2norm", {at: 100})
    try:
        got = _block_output(model, image, at)
    finally:
        unpatch(model)
    kept = mid[0, 1:].norm(dim=-1).argsort(descending=True)[:96].sort().values
    block = transformer_blocks(model)[at]
    expected = _finish_block(block, torch.cat([mid[:, :1], mid[:, 1 + kept]], dim=1))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)

    runs = []
    for seed in (0, 0, 1):
        patch(model, "random", {at: 100}, seed=seed)
        runs.append(_block_output(model, image, at))
    unpatch(model)
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


@pytest.mark.parametrize("method", METHODS)
def test_removing_nothing_leaves_the_model_exact(models, image, method):
    model = models["deit_small"]
    with torch.no_grad():
        reference = model(image)
        patch(model, method, {3: 0})
        assert patch_state(model) is not None
        assert type(model.blocks[3]).__name__ == "Block"
        assert torch.equal(model(image), reference)
        unpatch(model)


def test_call_layer_skips_only_layers_that_return_their_input():
    x = torch.ones(64, 64)
    assert call_layer(torch.nn.Identity(), x) is x
    assert call_layer(torch.nn.Dropout(0.5).eval(), x) is x
    assert call_layer(torch.nn.Dropout(0.0).train(), x) is x
    assert (call_layer(torch.nn.Dropout(0.5).train(), x) == 0).any()  # active dropout still runs
    scale = torch.nn.Linear(64, 64)
    assert torch.equal(call_layer(scale, x), scale(x))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # dynamo=False: the legacy TorchScript exporter
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # shapes read as Python ints: static by design
@pytest.mark.parametrize("method", ["pomt", "topk"])
def test_patched_model_exports_to_onnx_with_static_shapes(method, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = patch(_timm("deit_tiny_patch16_224", img_size=112), method, {3: 10})
    for batch, dynamo in [(1, False), (1, True), (2, False), (2, True)]:  # batch 1 gathers on its own path
        x = torch.randn(batch, 3, 112, 112, generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            expected = model(x)
        path = tmp_path / f"{method}_{batch}_{dynamo}.onnx"
        with contextlib.redirect_stdout(io.StringIO()):
            torch.onnx.export(model, (x,), str(path), dynamo=dynamo)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-4)


def test_patched_holds_the_plan_inside_the_context_only_even_when_it_raises(models, image):
    model = models["deit_small"]
    classes = [type(block) for block in transformer_blocks(model)]
    with torch.no_grad():
        reference = model(image)
        with patched(model, "topk", {3: 40}) as inside:
            assert inside is model and patch_state(model).removal == {3: 40}
            assert not torch.equal(model(image), reference)
        assert patch_state(model) is None and torch.equal(model(image), reference)
        with pytest.raises(RuntimeError, match="inside"), patched(model, "tome", 4):
            raise RuntimeError("inside")
    assert patch_state(model) is None and [type(block) for block in transformer_blocks(model)] == classes


def test_unpatch_restores_classes_attributes_and_outputs(models, image):
    model = models["dinov2_authors"]
    blocks = transformer_blocks(model)
    classes = [type(block) for block in blocks]
    with torch.no_grad():
        reference = model(image)
        for method in METHODS:
            patch(model, method, 8)
            assert model(image).shape == reference.shape
        patch(model, "topk", {5: 10})  # re-patching replaces the previous plan
        assert [type(b) is c for b, c in zip(blocks, classes, strict=True)].count(False) == 1
        unpatch(model)
        assert torch.equal(model(image), reference)
    assert [type(block) for block in blocks] == classes
    assert "_pomt_patch" not in model.__dict__
    assert not any("_pomt_plan" in block.__dict__ for block in blocks)
    assert not any(block._forward_hooks or block._forward_pre_hooks for block in blocks)


def test_bad_patch_arguments_raise(models):
    model = models["deit_small"]
    with pytest.raises(PatchError, match="choose one of pomt, topk, tome, l2norm, random"):
        patch(model, "magic", {3: 10})
    with pytest.raises(PatchError, match="blocks 0..11"):
        patch(model, "pomt", {12: 10})
    with pytest.raises(PatchError, match="at least one must stay"):
        patch(model, "topk", {3: 196})
    with pytest.raises(PatchError, match="at least one must stay"):
        patch(model, "pomt", {3: 100, 6: 96})
    assert patch_state(model) is None


def _schedule(batch: int = 1, kind: str = "cpu", verified: dict | None = None, allocator: dict | None = None,
              **extra) -> dict:
    """A deit_small schedule removing 56 tokens at block 3, verified on this machine unless told."""
    return Schedule(
        model="deit_small_patch16_224", input_size=(224, 224), batch_size=batch, num_tokens=197,
        prefix_tokens=1, depth=12, method="pomt", prune=(BlockRemoval(3, 56),),
        device=Fingerprint(kind=kind, allocator=allocator),
        verified=Verified.from_dict(verified_record() if verified is None else verified), **extra,
    ).to_dict()


def test_an_unverified_or_foreign_schedule_warns_once_and_strict_refuses(models):
    model = models["deit_small"]
    unverified = _schedule()
    del unverified["verified"]
    with pytest.raises(ScheduleError, match="unverified"):
        apply_schedule(model, unverified, strict=True)
    with pytest.warns(UnverifiedScheduleWarning, match="never measured on the patched model") as caught:
        apply_schedule(model, unverified)
        with torch.no_grad():
            model(torch.randn(1, 3, 224, 224))
    assert len([w for w in caught if w.category is UnverifiedScheduleWarning]) == 1  # at applying, not per forward
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_schedule(model, _schedule())  # verified here: silent
    foreign = _schedule(verified=verified_record("0123456789abcdef"))
    with pytest.raises(ScheduleError, match="verified on another device"):
        apply_schedule(model, foreign, strict=True)
    with pytest.warns(UnverifiedScheduleWarning, match="verified on another device"):
        apply_schedule(model, foreign)
    unpatch(model)


def test_a_schedule_measured_as_a_cuda_graph_is_checked_against_that_runtime(models):
    """It is served as a CUDA graph of the patched model (`pomt.cuda_graph`), so its hash is this process's
    with that runtime; a schedule of another runtime (compile) is served eager here, so it warns."""
    from pomt.deploy.apply import eager_fingerprint
    from pomt.device import fingerprint_hash

    model = models["deit_small"]
    graphed = fingerprint_hash(eager_fingerprint("cpu", "cudagraph"))
    assert graphed != fingerprint_hash(eager_fingerprint("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_schedule(model, _schedule(verified=verified_record(graphed), backend={"name": "cudagraph"}))
    unpatch(model)
    with pytest.warns(UnverifiedScheduleWarning, match="verified on another device or runtime"):
        apply_schedule(model, _schedule(verified=verified_record(graphed)))  # an eager schedule with that hash
    unpatch(model)
    compiled = fingerprint_hash(eager_fingerprint("cpu", "compile"))
    with pytest.warns(UnverifiedScheduleWarning, match="verified on another device or runtime"):
        apply_schedule(model, _schedule(verified=verified_record(compiled), backend={"name": "compile"}))
    unpatch(model)


def test_apply_schedule_from_a_file(models, image, tmp_path):
    model = models["deit_small"]
    path = tmp_path / "s.schedule.json"
    path.write_text(json.dumps(_schedule()))
    apply_schedule(model, path)
    try:
        counts, _ = _counts_and_outputs(model, image)
    finally:
        unpatch(model)
    assert counts[3:5] == [197, 141]


def test_schedule_for_another_geometry_raises(models):
    with pytest.raises(ScheduleError, match="does not match"):
        apply_schedule(models["dinov2_reg4"], _schedule())
    assert patch_state(models["dinov2_reg4"]) is None


def test_a_schedule_measured_under_other_allocator_settings_says_so_and_strict_refuses(models, monkeypatch):
    """A CPU schedule's promise holds under the allocator it was measured with (`pomt.device.allocator`)."""
    model = models["deit_small"]
    for name in ALLOCATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    steady = _schedule(allocator=dict(STEADY))
    with pytest.raises(ScheduleError, match="measured under MALLOC_MMAP_THRESHOLD_=33554432 "
                                           "MALLOC_TRIM_THRESHOLD_=268435456, this process runs glibc's defaults"):
        apply_schedule(model, steady, strict=True)
    with pytest.warns(UnverifiedScheduleWarning, match=r"pomt\.steady_allocator\(\)"):
        apply_schedule(model, steady)
    for name, value in STEADY.items():  # what steady_allocator leaves in the environment
        monkeypatch.setenv(name, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_schedule(model, steady)  # the same settings: silent
        apply_schedule(model, _schedule())  # a schedule that did not record them: silent
    with pytest.warns(UnverifiedScheduleWarning, match="measured under glibc's defaults, this process runs MALLOC"):
        apply_schedule(model, _schedule(allocator={}))
    unpatch(model)


def test_device_and_batch_mismatch_warn_or_raise(models, image):
    model = models["deit_small"]
    with pytest.raises(ScheduleError, match="made on cuda"):
        apply_schedule(model, _schedule(kind="cuda"), strict=True)
    with pytest.warns(UserWarning, match="made on cuda"):
        apply_schedule(model, _schedule(kind="cuda"))
    with pytest.raises(ScheduleError, match="batch size 4, not 2"):
        apply_schedule(model, _schedule(batch=4), strict=True, batch_size=2)
    apply_schedule(model, _schedule(batch=4), strict=True)
    with pytest.raises(ScheduleError, match="batch size 4"), torch.no_grad():
        model(image)
    apply_schedule(model, _schedule(batch=4))
    with pytest.warns(UserWarning, match="batch size 4"), torch.no_grad():
        model(image)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per patch, not at every forward
        with torch.no_grad():
            model(image)
    unpatch(model)


@pytest.mark.parametrize("method", METHODS)
def test_inference_mode_with_bfloat16_autocast(models, method):
    model = models["deit_small_distilled"]
    x = torch.randn(2, 3, 224, 224)
    patch(model, method, 30 if method == "tome" else {3: 56})
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
    finally:
        unpatch(model)
    assert out.shape == (2, 1000)
    assert torch.isfinite(out.float()).all()


def test_a_patched_model_deep_copies_and_runs_other_input_sizes(image):
    model = _timm("deit_small_patch16_224", dynamic_img_size=True)
    patch(model, "pomt", {3: 56})
    twin = copy.deepcopy(model)
    small = torch.randn(1, 3, 160, 160)
    counts, _ = _counts_and_outputs(twin, small)
    assert counts[3:5] == [101, 45]
    unpatch(twin)
    assert patch_state(twin) is None and patch_state(model) is not None
    with pytest.raises(PatchError, match="at least one must stay"):
        _counts_and_outputs(model, torch.randn(1, 3, 112, 112))


def test_resolve_removal_validates_blocks_and_counts():
    assert resolve_removal(2, 3) == {0: 2, 1: 2, 2: 2}
    assert resolve_removal({1: 0, 2: 5}, 3) == {2: 5}
    with pytest.raises(PatchError, match="blocks 0..2"):
        resolve_removal({3: 1}, 3)
    with pytest.raises(PatchError, match=">= 0"):
        resolve_removal({1: -1}, 3)
    with pytest.raises(PatchError, match="pomt, topk, tome, l2norm, random"):
        check_method("prune-everything")
