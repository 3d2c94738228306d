"""Benchmarks and experiment presets, each run as `python -m bench.NAME`."""
