"""The offline computation, one stage a module, each returning its product: `config` (what is asked, and
its checks), `prepare` (the run: live with its journal, or a recorded trace with `--replay`), `latency`
(the search), `fresh_steps` (steps within reach measured again in a fresh process), `accuracy` (A(n)),
`ranking` (the policy's candidates), `verdict` (the method's cost, verification here and in a fresh
process), `assemble` and `records` (the schedule), `outputs` (curve, schedule, plot); with a dataset, the
frontier policy's `frontier_setup` (calibration split and journal, before anything is measured),
`frontier_search`, `frontier_verdict`, `frontier_schedule`, `frontier_outputs`, strung together by
`frontier_pipeline`; `pipeline.run_offline` strings them together for the CLI and `offline_computation.py`."""

from pomt.offline.config import OfflineConfig
from pomt.offline.pipeline import OfflineResult, run_offline

__all__ = ["OfflineConfig", "OfflineResult", "run_offline"]
