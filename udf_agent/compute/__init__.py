"""The compute contract (task and result tables), the runners that call a UDF on them, the frame a UDF sees and the points it gives."""
