"""``kapacitor.udf.agent`` and ``kapacitor.udf.udf_pb2``, provided by udf-agent."""
