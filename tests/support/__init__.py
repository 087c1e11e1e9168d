"""Helpers shared by the tests: tiny data sets and models, synthetic traces, fake devices, broken files."""
