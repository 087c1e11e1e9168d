"""The accuracy cache: every measured (candidate, split) accuracy, one JSON line each, durable line by line.

The first line names the model the accuracies belong to (its identity: architecture, geometry, a digest of
its weights); a journal for another model is refused with `AccuracyCacheError`, never mixed in. Each later
line is one result, appended with one write and an fsync, so a killed search loses at most the line being
written: a half-written last line is cut off when the journal is opened again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from pomt.errors import AccuracyCacheError
from pomt.frontier.candidates import Candidate
from pomt.io import atomic_write_text
from pomt.models.geometry import model_geometry
from pomt.stats import Proportion

FORMAT = "pomt.accuracy-journal"
VERSION = 1


def weights_digest(model: nn.Module) -> str:
    """A digest of every parameter and buffer, by name: the same weights give the same digest anywhere."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def model_identity(model: nn.Module) -> dict:
    """What makes two models the same for accuracy: architecture, token geometry, classes, weights."""
    geometry = model_geometry(model)
    return {"model": geometry.model, "input_size": list(geometry.input_size), "num_tokens": geometry.num_tokens,
            "prefix_tokens": geometry.prefix_tokens, "depth": geometry.depth,
            "num_classes": getattr(model, "num_classes", None), "weights": weights_digest(model)}


def entry_key(candidate: Candidate, split: str) -> str:
    """The cache key of one result: the candidate's key and the split's (which names its images)."""
    return f"{split}|{candidate.key}"


class AccuracyJournal:
    """Accuracies by (candidate, split) for one model, read from and appended to a JSON-lines file
    (`path` None: in memory only)."""

    def __init__(self, path: str | Path | None, identity: Mapping) -> None:
        self.path = None if path is None else Path(path)
        self.identity = dict(identity)
        self.entries: dict[str, Proportion] = {}
        if self.path is None:
            return
        if self.path.is_file() and self.path.stat().st_size:
            self._read()
        else:
            header = {"format": FORMAT, "version": VERSION, "identity": self.identity}
            atomic_write_text(self.path, json.dumps(header, sort_keys=True) + "\n")

    def _read(self) -> None:
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        lines = complete.decode("utf-8", errors="replace").splitlines()
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("format") != FORMAT or header.get("version") != VERSION:
            raise AccuracyCacheError(f"{self.path} is not a pomt accuracy cache (version {VERSION}); "
                                     "delete it or choose another cache file")
        if header.get("identity") != self.identity:
            raise AccuracyCacheError(f"accuracy cache {self.path} belongs to another model "
                                     f"({_differences(header.get('identity') or {}, self.identity)}); "
                                     "delete it or choose another cache file")
        for number, line in enumerate(lines[1:], start=2):
            try:
                entry = json.loads(line)
                paired = [None if entry.get(k) is None else int(entry[k]) for k in ("lost", "gained")]
                self.entries[entry["key"]] = Proportion(int(entry["correct"]), int(entry["images"]), *paired)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise AccuracyCacheError(f"accuracy cache {self.path} is corrupt at line {number}; "
                                         "delete it to measure again") from None
        if len(complete) < len(data):
            with self.path.open("r+b") as handle:  # a line cut by a kill: measured again
                handle.truncate(len(complete))

    def get(self, candidate: Candidate, split: str) -> Proportion | None:
        return self.entries.get(entry_key(candidate, split))

    def add(self, candidate: Candidate, split: str, result: Proportion) -> Proportion:
        """Record one result (appended durably when the journal has a file)."""
        key = entry_key(candidate, split)
        self.entries[key] = result
        if self.path is not None:
            line = {"key": key, "split": split, **candidate.to_dict(), "correct": result.successes,
                    "images": result.trials, "lost": result.lost, "gained": result.gained}
            with self.path.open("ab") as handle:
                handle.write((json.dumps(line, sort_keys=True) + "\n").encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())
        return result


def _differences(stored: Mapping, now: Mapping) -> str:
    keys = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
    return ", ".join(f"{k} {stored.get(k)!r}, now {now.get(k)!r}" for k in keys)
