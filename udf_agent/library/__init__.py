"""The built-in UDFs (``udf-agent list``), written with the public API as any user's UDF is."""
