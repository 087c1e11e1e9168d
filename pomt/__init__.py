"""pomt: hardware-aware token pruning schedules for Vision Transformers."""

from pomt.deploy.apply import UnverifiedScheduleWarning, apply_schedule
from pomt.device.allocator import steady_allocator
from pomt.formats.schedule import Schedule, load_schedule, save_schedule
from pomt.models.geometry import Geometry, model_geometry
from pomt.models.registry import create_model, resolve_model_name
from pomt.patching import patch, unpatch
from pomt.runtimes.cudagraph import cuda_graph

__version__ = "0.1.0"

__all__ = [
    "Geometry",
    "Schedule",
    "UnverifiedScheduleWarning",
    "apply_schedule",
    "create_model",
    "cuda_graph",
    "load_schedule",
    "model_geometry",
    "patch",
    "resolve_model_name",
    "save_schedule",
    "steady_allocator",
    "unpatch",
]
