"""Runs the agent's micro-batches on Spark through a pandas UDF."""

from spark_backend.engine import SparkEngine
from spark_backend.settings import SparkSettings

__all__ = ["SparkEngine", "SparkSettings"]
