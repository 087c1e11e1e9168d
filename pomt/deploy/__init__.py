"""Serving a schedule: applying it to a model (`apply`) and exporting the scheduled model (`export`)."""
