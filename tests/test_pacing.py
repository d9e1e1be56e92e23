"""The read pacer: a pause only while input flows in small reads."""

from __future__ import annotations

from udf_agent.runtime.pacing import PAUSE, SMALL_READ, ReadPacer


def test_a_trickle_is_never_paused():
    pacer = ReadPacer()
    # A point every millisecond (1 k points/s), each in two reads as Kapacitor writes it: the
    # body's read follows its length's at once.
    pauses = [pacer.after_read(size, t / 1000 + dt) for t in range(100) for size, dt in ((2, 0.0), (150, 0.00002))]
    assert pauses == [0.0] * 200


def test_back_to_back_small_reads_pause_and_keep_pausing_while_input_flows():
    pacer = ReadPacer()
    now = 0.0
    assert pacer.after_read(300, now) == 0  # the first read after a quiet spell
    now += 0.00003
    assert pacer.after_read(300, now) == 0  # two in a row may be one point's two writes
    pauses = []
    for _ in range(50):
        now += 0.00003  # read, handled, and the next read returns at once
        pause = pacer.after_read(300, now)
        pauses.append(pause)
        now += pause
    assert pauses == [PAUSE] * 50  # the pause itself does not end the flow


def test_a_big_read_is_not_paused_after():
    pacer = ReadPacer()
    pacer.after_read(300, 0.0)
    pacer.after_read(300, 0.00001)
    assert pacer.after_read(SMALL_READ, 0.00002) == 0
    assert pacer.after_read(300, 0.00003) == PAUSE
