"""The latency curve file, `<stem>.curve.csv`: written beside its schedule, read back by the benchmark."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pomt.accuracy import AccuracyCurve
from pomt.errors import CurveError
from pomt.io import atomic_write_csv

COLUMNS = (
    "tokens", "latency_ms", "median_ms", "relative", "spread_ms", "min_ms", "visits", "samples", "se_ms",
    "accuracy", "accuracy_interpolated",
)


@dataclass(frozen=True)
class CurvePoint:
    """Pooled latency of one token count over all its visits: `median_ms` of the raw visit medians; `latency_ms`
    (what detection, plots and policies use) with drift divided out; `relative`: it over the reference count's."""

    tokens: int
    latency_ms: float
    median_ms: float
    relative: float
    spread_ms: float  # interquartile range of the visit medians
    min_ms: float
    visits: int
    samples: int
    se_ms: float = float("nan")  # standard error of latency_ms (between-visit noise)

    def to_row(self) -> dict:
        return asdict(self)


def rounded(row: dict) -> dict:
    """Floats (and floats in lists) to 4 decimals, for files people read."""
    out = {}
    for key, value in row.items():
        if isinstance(value, float):
            out[key] = round(value, 4)
        elif isinstance(value, (list, tuple)):
            out[key] = [round(v, 4) if isinstance(v, float) else v for v in value]
        else:
            out[key] = value
    return out


def write_curve(path: str | Path, points: Sequence[CurvePoint], accuracy: AccuracyCurve | None) -> Path:
    """One row per measured count: pooled latency (drift-corrected and raw), spread, visits, accuracy."""
    values = accuracy.at(p.tokens for p in points) if accuracy else {}
    rows = []
    for point in points:
        row = rounded(point.to_row())
        if accuracy:
            row["accuracy"] = round(values[point.tokens], 6)
            row["accuracy_interpolated"] = point.tokens not in accuracy.values
        rows.append(row)
    return atomic_write_csv(path, rows, COLUMNS)


def read_points(path: str | Path) -> list[CurvePoint]:
    """The rows of a curve file as `CurvePoint`s; a bad file is one CurveError line."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            points = [_point(row) for row in csv.DictReader(handle)]
    except FileNotFoundError:
        raise CurveError(f"latency curve not found: {path}") from None
    except OSError as exc:  # a folder where the file should be, no permission to read it
        raise CurveError(f"cannot read latency curve {path}: {exc.strerror}") from None
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise CurveError(f"corrupt latency curve {path}: needs numeric 'tokens' and 'latency_ms' ({exc})") from None
    if not points:
        raise CurveError(f"corrupt latency curve {path}: no rows")
    return points


def _point(row: dict) -> CurvePoint:
    latency = float(row["latency_ms"])

    def number(name: str, default: float) -> float:
        return float(row[name]) if row.get(name) not in (None, "") else default

    return CurvePoint(int(row["tokens"]), latency, number("median_ms", latency), number("relative", math.nan),
                      number("spread_ms", 0.0), number("min_ms", latency), int(number("visits", 1)),
                      int(number("samples", 1)), number("se_ms", math.nan))
