"""Benchmarks of udf-agent against a per-point agent built like Kapacitor's official Python one.

Run ``python benchmarks/run.py`` (see benchmarks/README.md).
"""
