"""Drives the real agent the way Kapacitor does and prints what comes back.

    python examples/demo.py

1. ``udf-agent run moving_avg`` on Kapacitor's own reference stream
   (groups a and b; expected moving averages 0.9 and 1.9 at t = 10 s),
   with keepalives every 100 ms while embedded Spark starts.
2. ``udf-agent run outliers`` on Kapacitor's reference batch of 20 values
   (expected: 5 outliers).

Exits non-zero when a result differs from Kapacitor's reference.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

from udf_agent import udf_pb2
from udf_agent.testing import KapacitorDriver, option, reference_stream

SECOND = 1_000_000_000
TUKEY_VALUES = [5, 6, 7, 13, 33, 35, 36, 45, 46, 47, 48, 50, 51, 52, 53, 54, 80, 85, 90, 100]


def moving_average_demo() -> bool:
    print("== moving_avg: .field('value').size(10).as('mean'), grouped by tag 'group'")
    driver = KapacitorDriver("run", "moving_avg", "--flush-interval", "100ms")
    stop = threading.Event()

    def keepalives() -> None:
        stamp = 0
        while not stop.is_set():
            stamp += 1
            driver.keepalive(stamp)
            stop.wait(0.1)

    ticker = threading.Thread(target=keepalives, daemon=True)
    ticker.start()
    started = time.monotonic()
    info = driver.info()
    print(f"   Info answered after {(time.monotonic() - driver.started) * 1000:.0f} ms: options {sorted(info.options)}")
    assert driver.init(option("field", "value"), option("size", 10), option("as", "mean")).success
    for point in reference_stream():
        driver.send(udf_pb2.Request(point=point))
    points = driver.responses.wait_for("point", 24, timeout=300)
    print(f"   24 results after {time.monotonic() - started:.1f} s (embedded Spark started meanwhile)")
    stop.set()
    ticker.join()
    code = driver.close()
    latencies = sorted(driver.keepalive_latencies())
    print(f"   {len(latencies)} keepalives answered: p50 {statistics.median(latencies) * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms")
    at_10 = {p.tags["group"]: p.fieldsDouble["mean"] for p in points if p.time == 10 * SECOND}
    print(f"   mean at t=10s: a -> {at_10['a']:.6g} (Kapacitor: 0.9), b -> {at_10['b']:.6g} (Kapacitor: 1.9); agent exit code {code}")
    return code == 0 and abs(at_10["a"] - 0.9) < 1e-9 and abs(at_10["b"] - 1.9) < 1e-9


def outliers_demo() -> bool:
    print("== outliers: .field('value').scale(1.5) on Kapacitor's reference batch")
    driver = KapacitorDriver("run", "outliers", "--flush-interval", "100ms")
    assert driver.init(option("field", "value")).success
    driver.begin(name="cpu", group="", size=len(TUKEY_VALUES))
    for i, value in enumerate(TUKEY_VALUES):
        driver.point(time=i * SECOND, fieldsDouble={"value": float(value)})
    driver.end(name="cpu", group="", tmax=19 * SECOND)
    driver.responses.wait_for("end", timeout=300)
    code = driver.close()
    outliers = sorted(p.fieldsDouble["value"] for p in driver.responses.of("point"))
    print(f"   outliers: {outliers} ({len(outliers)}, Kapacitor: 5); agent exit code {code}")
    return code == 0 and len(outliers) == 5


def main() -> int:
    results = [moving_average_demo(), outliers_demo()]
    print("demo OK: results match Kapacitor's reference" if all(results) else "demo FAILED: see above")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
