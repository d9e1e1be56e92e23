"""Runs the agent's micro-batches on Spark through a pandas UDF."""

from spark_backend.engine import SparkEngine, SparkSettings

__all__ = ["SparkEngine", "SparkSettings"]
