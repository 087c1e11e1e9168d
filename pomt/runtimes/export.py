"""A model's static program: `torch.export` of one forward, and torch's ONNX export of that program.

Non-eager runtimes run a static program, one per kept-token count: the token hook
(`pomt.models.tokens.truncate_tokens`) and the pruning patches are traced through. An export failure
becomes one ExportError naming the aten operation it failed on, when the exporter says which.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from pomt.errors import ExportError
from pomt.runtimes.backend import first_line

_OP_PATTERNS = (
    re.compile(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)"),
    re.compile(r"target=torch\.ops\.([\w.]+)"),
    re.compile(r"\b(aten::\w+)"),
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the exporters' progress prints and warnings off the user's terminal."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _failed_operation(exc: BaseException) -> str | None:
    """The aten operation an exporter failure names, if it names one."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    for pattern in _OP_PATTERNS:
        for text in texts:
            match = pattern.search(text)
            if match:
                return ".".join(part for part in match.groups() if part).replace("::", ".")
    return None


def _innermost(exc: BaseException) -> BaseException:
    seen = set()
    while (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return exc


def _export_failure(exc: BaseException, stage: str) -> ExportError:
    operation = _failed_operation(exc)
    reason = first_line(_innermost(exc))
    what = f"operation {operation} " if operation else ""
    return ExportError(f"{stage} failed (torch {torch.__version__}): {what}cannot be exported: {reason}")


def export_program(model: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    """`torch.export` of `model(example)` at static shapes (token hooks and patches traced through)."""
    try:
        with _quiet(), torch.no_grad():
            return torch.export.export(model, (example,), strict=False)
    except Exception as exc:
        raise _export_failure(exc, "torch.export") from exc


def _translations() -> dict:
    """ONNX translations torch's exporter lacks. aten.sort.stable: TopK over the whole axis, which
    breaks ties by the lower index first, as a stable sort does."""
    from onnxscript import opset18 as op

    def sort_stable(self, *, stable=None, dim: int = -1, descending: bool = False):
        size = op.Reshape(op.Gather(op.Shape(self), dim, axis=0), op.Constant(value_ints=[1]))
        return op.TopK(self, size, axis=dim, largest=descending, sorted=True)

    return {torch.ops.aten.sort.stable: sort_stable}


def onnx_program(model: nn.Module, example: torch.Tensor):
    """torch's ONNX program (`torch.onnx.ONNXProgram`) of `model(example)` at static shapes."""
    program = export_program(model, example)
    try:
        with _quiet():
            return torch.onnx.export(
                program, (example,), dynamo=True, verbose=False, optimize=True,
                custom_translation_table=_translations(),
            )
    except Exception as exc:
        raise _export_failure(exc, "ONNX export") from exc
