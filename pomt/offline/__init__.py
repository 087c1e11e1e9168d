"""The offline computation in six stages, each a module returning its product: `config`, `measure` (the run,
the latency curve, A(n)), `choose` (a policy's ranking or the frontier search), `verify` (the patched model against
the unpruned one), `write` (the schedule and the run's files) and `pipeline` (`run_offline`)."""

from pomt.offline.config import OfflineConfig
from pomt.offline.pipeline import OfflineResult, run_offline

__all__ = ["OfflineConfig", "OfflineResult", "run_offline"]
