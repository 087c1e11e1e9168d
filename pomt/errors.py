"""Exceptions that carry a message a user can act on; the CLI prints them as one line, exit code 2."""

from __future__ import annotations


class PomtError(Exception):
    """Base class for every user-facing pomt error."""


class UnknownModelError(PomtError):
    """The model name is not in timm's registry (nor a pomt alias)."""


class InputSizeError(PomtError):
    """The input size does not fit the model (not divisible by the patch size, or not positive)."""


class WeightsError(PomtError):
    """Pretrained weights or a checkpoint could not be loaded."""


class GridError(PomtError):
    """A token count or token grid lies outside what the model allows."""


class BatchSizeError(PomtError):
    """The batch size is not a positive integer."""


class DeviceError(PomtError):
    """The requested device is not available, or clocks are not in the required state."""


class DatasetError(PomtError):
    """The dataset folder is missing or holds no usable images."""


class ScheduleError(PomtError):
    """A schedule file is corrupt, of an unknown version, or does not match the model."""


class PatchError(PomtError):
    """A model cannot be patched as asked (unsupported blocks, unknown method, bad removal)."""


class CurveError(PomtError):
    """A latency or accuracy curve file is corrupt or does not match the run."""


class TraceError(PomtError):
    """A latency trace (CSV + JSON sidecar) is missing, corrupt, or does not match the model it names."""


class PolicyError(PomtError):
    """A scheduling policy cannot be applied as asked (missing accuracy, unreachable budget)."""


class BackendError(PomtError):
    """A runtime backend or dtype cannot be used here (package missing, wrong device, unsupported dtype)."""


class ExportError(PomtError):
    """A model cannot be exported (an operation without a translation), or the export does not match PyTorch."""


class CalibrationError(PomtError):
    """The calibration images cannot answer what is asked of them (too few for the accuracy drop asked)."""


class AccuracyCacheError(PomtError):
    """An accuracy cache (journal) is corrupt or belongs to another model."""


class UnsupportedModelError(PatchError):
    """The model is not a ViT-family transformer with patch tokens that pomt can patch (a ResNet, a ConvNeXt)."""


class SettingError(PomtError):
    """A setting lies outside the range it allows, or settings contradict each other."""


class OutputError(PomtError):
    """An output path cannot be written: a file in the way, a read-only folder, a folder where a file must go."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what became of the run in one line (`after_visits`); a KeyboardInterrupt, exit code 130."""

    @classmethod
    def after_visits(cls, visits: int) -> Interrupted:
        if visits == 0:
            return cls("interrupted before any visit was measured; nothing to resume")
        return cls(f"interrupted after {visits} visits; rerun with --resume to continue")


class LatencyFileError(PomtError):
    """A latency or candidates file that is corrupt, of another version, or of another workload or device."""
