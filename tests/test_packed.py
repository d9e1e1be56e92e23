"""The packed form of a stream micro-batch's tasks and of results (``compute/packed.py``):
the same rows as the compute contract's tables, both ways, and a message that does not hold
exactly its columns refused wherever it is cut."""

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from udfs import sample

from udf_agent.compute.contract import Job, Result, Task, results_table, tasks_table
from udf_agent.compute.packed import Blobs, ResultColumns, StreamTasks, unpack
from udf_agent.compute.run import compute_stream, compute_tasks
from udf_agent.library.builtins import moving_avg
from udf_agent.wire.batches import StreamMicroBatch

ITEMS = [b"one", None, b"", "ünïcode\x00".encode(), None, b"\xff" * 300]


@pytest.mark.parametrize("copies", [1, 10], ids=["a few items (walked in Python)", "many (numpy)"])
def test_blobs_keep_missing_and_empty_items_apart_whatever_they_hold(copies):
    many = Blobs.of(ITEMS * copies)
    assert many.ends.tolist() == np.cumsum(np.maximum(many.lengths, 0)).tolist() and many.ends[-1] == len(many.data)
    assert Blobs.missing(6 * copies).all_missing() and not many.all_missing() and Blobs.of([None] * 6 * copies).all_missing()
    blobs = Blobs.of(ITEMS)
    assert blobs.tolist() == ITEMS
    assert blobs.lengths.tolist() == [3, -1, 0, 10, -1, 300]
    assert blobs.ends.tolist() == [3, 3, 3, 13, 13, 313]
    assert blobs.slice(1, 4).tolist() == ITEMS[1:5]
    assert blobs.slice(6, 0).tolist() == []
    assert Blobs.concat([blobs.slice(0, 2), blobs.slice(2, 4)]).tolist() == ITEMS
    assert blobs.without([0, 3]).tolist() == [None, None, b"", None, None, ITEMS[5]]
    assert Blobs.missing(3).tolist() == [None] * 3 and Blobs.missing(3).all_missing() and not blobs.all_missing()
    assert Blobs.of_texts(["a", None, "é"]).texts() == ["a", None, "é"]


@pytest.mark.parametrize("kind", [pa.binary(), pa.string(), pa.large_binary()])
def test_blobs_read_an_arrow_column_as_it_lies_sliced_chunked_or_with_nulls(kind):
    items = [b"ab", None, b"", b"cde", None, b"f"]
    values = [None if item is None else (item.decode() if kind == pa.string() else item) for item in items]
    column = pa.array(values, kind)
    assert Blobs.of_arrow(column).tolist() == items
    assert Blobs.of_arrow(column.slice(2, 3)).tolist() == items[2:5]
    assert Blobs.of_arrow(pa.chunked_array([column.slice(0, 2), column.slice(2)])).tolist() == items
    assert Blobs.of_arrow(pa.array([], kind)).tolist() == []
    back = Blobs.of_arrow(column).arrow(pa.binary())
    assert back.to_pylist() == items and back.null_count == 2


def _tasks() -> StreamTasks:
    return StreamTasks(np.array([7, 8, 9]), ["host=a", "", "host=ü"], Blobs.of([b"\x01x", b"", b"\x02yy"]), Blobs.of([None, b"\x01h", None]), Blobs.of_texts(['{"n":1}', None, None]))


def _results() -> ResultColumns:
    results = [Result(7, "host=a", b"out", b"hist", None, None, 1), Result(8, "", None, None, '{"s":2}', None, 0), Result(9, "host=ü", b"", None, None, "UDF failed: ü", 0)]
    return ResultColumns.of_results(results)


def _joined(parts) -> bytes:
    return b"".join(bytes(part) for part in parts)


def test_stream_tasks_and_results_come_back_row_for_row_from_their_packed_messages():
    tasks = _tasks()
    again = StreamTasks.unpack(_joined(tasks.pack()))
    assert (again.seq.tolist(), again.keys) == ([7, 8, 9], tasks.keys)
    for name in ("data", "histories", "states"):
        assert getattr(again, name).tolist() == getattr(tasks, name).tolist()
    assert again.tasks() == tasks.tasks() == [Task(7, "host=a", b"\x01x", None, '{"n":1}'), Task(8, "", b"", b"\x01h", None), Task(9, "host=ü", b"\x02yy", None, None)]
    results = _results()
    back = ResultColumns.unpack(_joined(results.pack()))
    assert back.emitted.tolist() == [1, 0, 0]
    assert back.output.tolist() == [b"out", None, b""] and back.histories.tolist() == [b"hist", None, None]
    assert back.states.texts() == [None, '{"s":2}', None] and back.errors.texts() == [None, None, "UDF failed: ü"]
    empty = StreamTasks.unpack(_joined(StreamTasks(np.zeros(0, np.int64), [], Blobs.of([]), Blobs.of([]), Blobs.of([])).pack()))
    assert len(empty) == 0


def test_the_packed_forms_convert_to_and_from_the_contract_tables():
    tasks = _tasks()
    table = tasks.table()
    assert table.equals(tasks_table(tasks.tasks()))
    from_table = StreamTasks.of_table(table)
    assert from_table.tasks() == tasks.tasks() and from_table.seq.tolist() == [7, 8, 9]
    results = _results()
    expected = results_table([Result(7, "host=a", b"out", b"hist", None, None, 1), Result(8, "", None, None, '{"s":2}', None, 0), Result(9, "host=ü", b"", None, None, "UDF failed: ü", 0)])
    assert results.table(tasks).equals(expected)
    round_trip = ResultColumns.of_table(expected)
    assert round_trip.table(tasks).equals(expected)
    two = ResultColumns.concat([ResultColumns.of_table(expected.slice(0, 1)), ResultColumns.of_table(expected.slice(1))])
    assert two.table(tasks).equals(expected)
    assert tasks.slice(1, 2).tasks() == tasks.tasks()[1:]


def test_a_packed_message_cut_anywhere_or_with_bytes_past_its_columns_is_refused():
    whole = _joined(_tasks().pack())
    for cut in range(len(whole)):
        with pytest.raises(ValueError):
            unpack(whole[:cut], 1, 4)
    with pytest.raises(ValueError, match="past its columns"):
        unpack(whole + b"\x00", 1, 4)
    with pytest.raises(ValueError, match="cannot hold"):
        unpack(np.array([-1], "<i8").tobytes(), 1, 4)
    many = StreamTasks(np.arange(40), ["k"] * 40, Blobs.missing(40), Blobs.missing(40), Blobs.missing(40))  # lengths checked by the compiled call
    for tasks in (_tasks(), many):
        for bad in (-2, 2**62):  # no length, or lengths whose sum wraps around
            lengths = np.full(len(tasks), 2**62 if bad > 0 else 0)
            lengths[-1] = bad
            broken = dataclasses.replace(tasks, histories=Blobs(b"", lengths))
            with pytest.raises(ValueError, match="lengths run past"):
                StreamTasks.unpack(_joined(broken.pack()))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "few rows, in Python"])
def test_blob_sizes_are_their_numpy_twin(seed, compiled):
    """``blob_sizes`` and its Python walk for a few rows against the numpy they replaced: the
    check of every length, then the sums."""
    from udf_agent.compute.packed import NONE, _blob_sizes_of_few, blob_sizes

    rng = np.random.default_rng(seed)
    for columns, count in ((4, 0), (4, 1), (4, 7), (1, 300), (0, 5)):
        lengths = rng.integers(-1, 50, size=(columns, count))
        if seed % 2 and lengths.size:  # one length out of range: below NONE, or over the limit
            lengths.flat[rng.integers(lengths.size)] = rng.choice([-2, 51, 2**62])
        frozen = np.frombuffer(lengths.astype("<i8").tobytes(), "<i8").reshape(columns, count)  # read-only, as unpacked
        valid = not lengths.size or (lengths.min() >= NONE and lengths.max() <= 50)
        twin = np.maximum(lengths, 0).sum(axis=1) if valid else np.full(columns, -1)
        sizes = blob_sizes(frozen, 50).tolist() if compiled else _blob_sizes_of_few(frozen.ravel().tolist(), columns, count, 50)
        assert sizes == twin.tolist()


def _points(count: int, start: int = 0) -> StreamTasks:
    from udf_agent import udf_pb2

    batch = StreamMicroBatch(opened_at=0)
    for i in range(start, start + count):
        host = f"h{i % 3}"
        point = udf_pb2.Point(time=i, name="cpu", group=f"host={host}", dimensions=["host"], tags={"host": host}, fieldsDouble={"value": float(i)}, fieldsInt={"i": i})
        batch.append(point.group, point.SerializeToString())
    grouped = batch.grouped()
    return StreamTasks.of_table(tasks_table([Task(seq, group, grouped.points(seq), None, None) for seq, group in enumerate(grouped.keys)]))


@pytest.mark.parametrize(
    "job",
    [Job(moving_avg, {"field": "value", "size": 3, "as": "avg"}), Job(sample.counter, {}), Job(sample.time_sum, {"window": 4}), Job(sample.failing, {})],
    ids=["vectorized", "with state", "time window", "failing"],
)
def test_compute_stream_is_compute_tasks_in_packed_form(job):
    tasks = _points(12)
    first = compute_stream(job, tasks)
    assert first.table(tasks).equals(compute_tasks(job, tasks.table()))
    # A Spark job's partition need not hold consecutive tasks: each result keeps its task's seq.
    scattered = tasks.table().slice(0, 3).set_column(0, "seq", pa.array([5, 2, 9], pa.int64()))
    assert compute_tasks(job, scattered).column("seq").to_pylist() == [5, 2, 9]
    # The next micro-batch, with the histories the first left.
    later = dataclasses.replace(_points(9), histories=first.histories, states=first.states)
    assert compute_stream(job, later).table(later).equals(compute_tasks(job, later.table()))


@pytest.mark.parametrize("udf", [moving_avg, sample.time_sum], ids=["the last rows, vectorized", "a time window, group by group"])
def test_a_udf_that_names_what_it_reads_keeps_its_history_compact_and_computes_the_same(udf):
    """Kept for a UDF with ``reads``, a group's history holds a point's time, name, database,
    retention policy and the columns read, and nothing else (a fraction of its bytes): the
    next micro-batches compute what they would from the points whole, on both paths."""
    options = {"field": "value", "size": 3, "as": "avg"} if udf is moving_avg else {"window": 4}
    jobs = {"reading": Job(dataclasses.replace(udf, reads=["value"]), options), "whole": Job(dataclasses.replace(udf, reads=None), options)}
    tasks, sent = {name: _points(12) for name in jobs}, 12
    for count in (9, 5, 14):
        results = {name: compute_stream(job, tasks[name]) for name, job in jobs.items()}
        tables = {name: results[name].table(tasks[name]) for name in jobs}
        assert tables["reading"].drop(["history"]).equals(tables["whole"].drop(["history"]))
        assert not any(results["reading"].errors.texts())
        assert tables["reading"].equals(compute_tasks(jobs["reading"], tasks["reading"].table()))
        compact, whole = results["reading"].histories, results["whole"].histories
        assert 0 < len(compact.data) < len(whole.data) / 2
        for kept in compact.tolist():
            assert b"host" not in kept and b"value" in kept
        tasks = {name: dataclasses.replace(_points(count, sent), histories=results[name].histories, states=results[name].states) for name in jobs}
        sent += count


@pytest.mark.parametrize("count", [3, 40], ids=["a few items (walked in Python)", "many (compiled)"])
def test_alternated_items_lie_one_after_another_in_one_buffer_with_their_bounds(count):
    """A stream slice's histories then points, group after group (``compute_stream``): missing
    and empty items take no bytes and still have their bounds."""
    from udf_agent.compute.packed import alternated

    rng = np.random.default_rng(count)
    first = [None if rng.random() < 0.3 else bytes(rng.integers(0, 256, rng.integers(0, 9), np.uint8)) for _ in range(count)]
    second = [bytes(rng.integers(0, 256, rng.integers(0, 9), np.uint8)) for _ in range(count)]
    joined, bounds = alternated(Blobs.of(first), Blobs.of(second))
    items = [item for pair in zip(first, second) for item in pair]
    assert joined == b"".join(item or b"" for item in items)
    assert bounds.tolist() == [0, *np.cumsum([len(item or b"") for item in items]).tolist()]
