"""Kapacitor's bytes: frames and varints, point columns, micro-batches, and the compiled kernels beside their plain-Python twins."""
