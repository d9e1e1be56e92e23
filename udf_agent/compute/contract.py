"""The compute contract: what an engine is given for a micro-batch, and what it gives back.

A micro-batch reaches an engine as a task table, one row per group (stream) or per Kapacitor
batch: the group's new points as the bytes Kapacitor sent, its kept history as the bytes of its
last points (the same form), its UDF state as JSON, and for a Kapacitor batch the batch's own
name, tags, tmax and byName. An engine answers with a result table, row for row: the encoded
output frames, the new history and state, or the error. Each table has one Arrow schema; the
Spark DDL a Spark job declares is derived from it (``spark_ddl``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import pyarrow as pa

from udf_agent.api import UDFSpec
from udf_agent.options import OptionValues, duration_positions


class Task(NamedTuple):
    """One group's (or one Kapacitor batch's) work in a micro-batch."""

    seq: int
    key: str
    data: bytes  # its new points, length-prefixed, as Kapacitor sent them
    history: bytes | None  # its kept last points, the same way
    state: str | None  # its UDF state, JSON
    # A Kapacitor batch's BeginBatch/EndBatch fields; None for a stream group.
    batch_name: str | None = None
    batch_tag_keys: list[str] | None = None
    batch_tag_values: list[str] | None = None
    batch_tmax: int | None = None
    batch_by_name: bool | None = None

    def batch_tags(self) -> dict[str, str]:
        return dict(zip(self.batch_tag_keys or (), self.batch_tag_values or ()))


class Result(NamedTuple):
    """What one task gave: its output frames and new history and state, or its error."""

    seq: int
    key: str
    output: bytes | None
    history: bytes | None
    state: str | None
    error: str | None
    emitted: int  # output points


TASK_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()), ("key", pa.string()), ("data", pa.binary()), ("history", pa.binary()), ("state", pa.string()),
        ("batch_name", pa.string()), ("batch_tag_keys", pa.list_(pa.string())), ("batch_tag_values", pa.list_(pa.string())),
        ("batch_tmax", pa.int64()), ("batch_by_name", pa.bool_()),
    ]
)
RESULT_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()), ("key", pa.string()), ("output", pa.binary()), ("history", pa.binary()),
        ("state", pa.string()), ("error", pa.string()), ("emitted", pa.int64()),
    ]
)
assert TASK_SCHEMA.names == list(Task._fields) and RESULT_SCHEMA.names == list(Result._fields)

_SPARK_TYPES = {pa.int64(): "long", pa.string(): "string", pa.binary(): "binary", pa.bool_(): "boolean"}


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL of an Arrow schema made of the types above (and lists of them)."""

    def spark_type(arrow_type: pa.DataType) -> str:
        if pa.types.is_list(arrow_type):
            return f"array<{spark_type(arrow_type.value_type)}>"
        return _SPARK_TYPES[arrow_type]

    return ", ".join(f"{field.name} {spark_type(field.type)}" for field in schema)


def tasks_table(tasks: Sequence[Task]) -> pa.Table:
    return pa.table({name: [task[i] for task in tasks] for i, name in enumerate(Task._fields)}, schema=TASK_SCHEMA)


def tasks_of(table: pa.Table) -> list[Task]:
    return [Task(*values) for values in zip(*(table.column(name).to_pylist() for name in Task._fields))]


def results_table(results: Sequence[Result]) -> pa.Table:
    return pa.table({name: [result[i] for result in results] for i, name in enumerate(Result._fields)}, schema=RESULT_SCHEMA)


@dataclass
class Job:
    """What a worker needs besides the tasks: the UDF and its parsed options."""

    spec: UDFSpec
    options: dict[str, Any]  # as parsed from the InitRequest (durations in ns)
    task_id: str = ""
    node_id: str = ""

    def option_values(self) -> OptionValues:
        return self._option_values

    @cached_property
    def _option_values(self) -> OptionValues:
        # One made for all the job's calls: they are read-only.
        return OptionValues(self.options, duration_positions(self.spec.options))

    @cached_property
    def history_window(self) -> dict[str, int] | None:
        """The history every group of the job keeps (``UDFSpec.history_window``)."""
        return self.spec.history_window(self.option_values())

    @cached_property
    def frame_columns(self) -> frozenset[str] | None:
        """The columns the job's frames hold besides ``time`` (``UDFSpec.frame_columns``)."""
        return self.spec.frame_columns(self.option_values())
