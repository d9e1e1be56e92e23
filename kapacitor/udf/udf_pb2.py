"""Kapacitor's UDF protocol messages and enums (``udf_pb2.Response()``, ``udf_pb2.STREAM``):
udf-agent's own compiled ``udf.proto``, the same messages as Kapacitor's."""

from udf_agent.udf_pb2 import *  # noqa: F401,F403
from udf_agent.udf_pb2 import DESCRIPTOR  # noqa: F401
