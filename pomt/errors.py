"""Exceptions that carry a message a user can act on; the CLI prints them as one line, exit code 2."""


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
