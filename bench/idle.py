"""What an idle purger costs: a purger with nothing to read but its clock's ticks, for ``--seconds``, against a
native Spark query that reads the same kind of ticks from Kafka at the same trigger into Spark's noop sink.

For each, in the same run, one after the other: the machine's busy cores (CPU seconds a second, every process:
nothing else should run), the batches it ran, and their mean ``triggerExecution`` from the query's progress;
and the machine's busy cores with no query at all (the servers and the session), measured last. The purger
runs with its configuration's trigger and clock (the product's defaults unless ``--set`` changes them).

    python -m bench.idle --seconds 60
    python -m bench.idle --seconds 60 --set stream.clock_interval=5s
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from bench.common import BenchRun, overrides, ticking
from purger.core.times import duration_ms
from purger.running import start_purger


def machine_busy_s() -> float:
    """CPU seconds this machine has been busy (every process: the JVM, Spark's Python workers, which come and
    go, and the servers answering them), from /proc/stat."""
    user, nice, system, idle, iowait, *rest = map(int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:])
    return (user + nice + system + sum(rest)) / os.sysconf("SC_CLK_TCK")


def measured(query, seconds: float) -> tuple[float, int, float]:
    """The machine's busy cores over ``seconds``, the batches run meanwhile and their mean triggerExecution (ms)."""
    first_batch = query.lastProgress["batchId"] if query.lastProgress else -1
    cpu_before, started = machine_busy_s(), time.monotonic()
    time.sleep(seconds)
    cores = (machine_busy_s() - cpu_before) / (time.monotonic() - started)
    batches = [p for p in query.recentProgress if p["batchId"] > first_batch]
    mean_ms = statistics.mean(p["durationMs"].get("triggerExecution", 0) for p in batches) if batches else 0.0
    return cores, len(batches), mean_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warm-up", type=float, default=60, help="seconds before each measure")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()

    run = BenchRun.start("idle", **overrides(args.set))
    spark = run.spark()
    stream = run.config.stream
    trigger = f"{duration_ms(stream.trigger_interval)} milliseconds"
    details = {"seconds": args.seconds, "trigger_interval_s": stream.trigger_interval.total_seconds(),
               "clock_interval_s": stream.clock_interval.total_seconds()}

    purger = start_purger(spark, run.config)
    try:
        time.sleep(args.warm_up)
        purger_cores, purger_batches, purger_ms = measured(purger.query, args.seconds)
    finally:
        purger.stop()

    kafka = run.config.kafka
    native = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("subscribe", kafka.control_topic).option("startingOffsets", "latest").load()
              .writeStream.format("noop").trigger(processingTime=trigger)
              .option("checkpointLocation", str(run.work / "native-checkpoint")).start())
    try:
        with ticking(run.config, stream.clock_interval.total_seconds()):
            time.sleep(args.warm_up)
            native_cores, native_batches, native_ms = measured(native, args.seconds)
    finally:
        native.stop()
    time.sleep(args.warm_up)
    quiet_before, started = machine_busy_s(), time.monotonic()
    time.sleep(args.seconds)
    quiet_cores = (machine_busy_s() - quiet_before) / (time.monotonic() - started)

    baseline = "a native Kafka query of the same ticks at the same trigger"
    run.record("idle purger, cores used", purger_cores, "cores", baseline=(baseline, native_cores), **details)
    run.record("no query (the servers and the idle session), cores used", quiet_cores, "cores", **details)
    run.record("idle purger, batches a minute", purger_batches * 60 / args.seconds, "batches",
               baseline=(baseline, native_batches * 60 / args.seconds), **details)
    run.record("idle purger, a batch's triggerExecution, mean", purger_ms, "ms", baseline=(baseline, native_ms),
               **details)
    spark.stop()


if __name__ == "__main__":
    main()
