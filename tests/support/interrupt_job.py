"""A job for a fresh process that says it has started (a file), then works (sleeps) until it is stopped."""

import time
from pathlib import Path


def touch_then_sleep(path: str) -> None:
    Path(path).write_text("started\n")
    time.sleep(120)
