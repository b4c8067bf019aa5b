"""The cost of a micro-batch with nothing due, beside a native aggregation's batch at the same trigger.

    python -m bench.batch --rate 20 --seconds 60

The platform sends the default workload's events (no rows or blobs) at
``--rate`` messages per second, with retention periods of an hour, so nothing
comes due: every batch reads a few dozen events, updates their objects' state
and timers, and purges nothing. Over the same load, one after the other, each
from the latest offset and a fresh checkpoint for ``--seconds``:

1. the baseline: a native Spark aggregation over the same source, parsing and
   routing (a count and the latest event time per object, RocksDB state, the
   same shuffle partitions) into Spark's noop sink, with a clock tick every
   second;
2. the whole purger (``purger.running.start_purger``: stateful stage, the sink
   and its clock), once per variant of the settings.

Both run at the purger's default trigger interval.

A variant's figure is the median ``triggerExecution`` of its batches after the
first five, and its Spark jobs' median time per step (the Spark UI's job
descriptions: "purge candidates", and "ledger" when a batch decided anything),
which is its profile; and the processes and threads started on the machine
per batch (``/proc/stat``), since each checkpoint file written to a local disk
through Hadoop's FileContext starts a ``chmod`` and a ``readlink``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from bench.common import BenchRun, job_steps, spark_jobs, ticking
from purger.core.times import duration_ms
from purger.core.settings import PurgerConfig
from purger.running import start_purger
from simulation.mailbox import Platform
from simulation.workload import Workload, play_all
from purger.streams.checkpoint import AVRO, ENCODING_CONF, UNSAFEROW
from purger.streams.parse import parse_events
from purger.streams.processor import routed
from purger.streams.source import read_records

RETENTION = {"expired_ttl": "1h", "incomplete_ttl": "1h", "deleted_ttl": "1h", "payload_grace": "1h"}
WARM_UP_BATCHES = 5

# Settings tried on the purger, each a fresh checkpoint in the same run: name -> session settings.
VARIANTS: dict[str, dict[str, str]] = {
    "purger": {},
    "purger, without RocksDB changelog checkpointing (the default before)": {
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "false"},
    "purger, 4 shuffle partitions (the default before)": {"spark.sql.shuffle.partitions": "4"},
    # Through Hadoop's FileContext, each checkpoint file on a local disk starts a chmod and a readlink.
    "purger, checkpoint files through Hadoop's FileContext (the default before)": {
        "spark.sql.streaming.checkpointFileManagerClass":
            "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"},
}


def forks() -> int:
    """Processes and threads started on the machine since boot (``/proc/stat``)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("processes "):
            return int(line.split()[1])
    return 0


def under_load(run: BenchRun, name: str, query: StreamingQuery, seconds: float, rate: float,
               ) -> tuple[list[dict[str, Any]], float]:
    """Play ``rate`` messages per second at a running query for ``seconds``; its progress, and the
    processes and threads started on the machine per batch meanwhile."""
    platform = Platform(run.config, events_only=True)
    try:
        plans = Workload().plans(f"{run.run}-{_slug(name)}", int(rate * seconds))
        started, batches = forks(), len(query.recentProgress)
        play_all(platform, plans, rate=rate)
        if query.exception() is not None:
            raise RuntimeError(f"{name}: query failed: {query.exception()}")
        progress = [json.loads(p.json) for p in query.recentProgress]
        return progress, round((forks() - started) / max(1, len(progress) - batches), 1)
    finally:
        platform.close()


def median_batch_s(progress: list[dict[str, Any]]) -> tuple[float, int]:
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress[WARM_UP_BATCHES:]
                 if p["numInputRows"]]
    return statistics.median(durations), len(durations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=20, help="messages per second")
    parser.add_argument("--seconds", type=float, default=60, help="per query")
    args = parser.parse_args()
    run = BenchRun.start("batch", policies={"mailbox": RETENTION},
                         kafka={"starting_offsets": "latest"})
    config = run.config
    trigger_ms = duration_ms(config.stream.trigger_interval)
    trigger = f"{trigger_ms / 1000:g} s"
    spark = run.spark()
    policies = config.policy_set

    def native() -> StreamingQuery:
        parsed = parse_events(read_records(spark, config), config.kafka.written_by_purger, policies)
        counts = routed(parsed, policies).groupBy("kind", "id").agg(
            F.count(F.lit(1)).alias("events"), F.max("event_time_ms").alias("latest_ms"))
        # Spark's aggregation keeps its state in unsaferow only (the purger's session says Avro: purger.spark).
        spark.conf.set(ENCODING_CONF, UNSAFEROW)
        try:
            return (counts.writeStream.queryName(f"{run.run}-native").format("noop").outputMode("update")
                    .option("checkpointLocation", str(run.work / "checkpoint-native"))
                    .trigger(processingTime=f"{trigger_ms} milliseconds").start())
        finally:
            spark.conf.set(ENCODING_CONF, AVRO)

    with ticking(config):
        query = native()
        try:
            progress, native_forks = under_load(run, "native", query, args.seconds, args.rate)
        finally:
            query.stop()
    native_s, batches = median_batch_s(progress)
    run.record("batch with nothing due, native Spark aggregation (median)", native_s, "s", batches=batches,
               trigger=trigger, rate=args.rate, forks_per_batch=native_forks)

    # RocksDB's settings are not registered SQL settings: unset, they have no value to read back.
    defaults = {key: spark.conf.get(key, None) for settings in VARIANTS.values() for key in settings}
    for name, settings in VARIANTS.items():
        _set(spark, {**defaults, **settings})
        variant = _variant_config(config, run, name)
        since_ms = time.time() * 1000
        running = start_purger(spark, variant)
        try:
            progress, variant_forks = under_load(run, name, running.query, args.seconds, args.rate)
        finally:
            running.stop()
        seconds, batches = median_batch_s(progress)
        steps = job_steps(spark_jobs(spark, since_ms))
        run.record(f"batch with nothing due, {name} (median)", seconds, "s",
                   baseline=("native Spark aggregation", native_s), target="<= 1.5x", batches=batches,
                   trigger=trigger, rate=args.rate, settings=settings, forks_per_batch=variant_forks,
                   steps={step: round(s, 3) for step, s in steps.items()})
        print(f"  {name}: median job time per step: "
              + ", ".join(f"{step} {s:.2f} s" for step, s in sorted(steps.items())), flush=True)
    _set(spark, defaults)


def _set(spark: SparkSession, settings: dict[str, str | None]) -> None:
    for key, value in settings.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def _slug(name: str) -> str:
    return name.replace(" ", "-").replace(",", "")


def _variant_config(config: PurgerConfig, run: BenchRun, name: str) -> PurgerConfig:
    slug = _slug(name)
    stream = config.stream.model_copy(update={"checkpoint": str(run.work / f"checkpoint-{slug}"),
                                              "query_name": f"{run.run}-{slug}"})
    ledger = config.ledger.model_copy(update={"path": str(run.work / f"ledger-{slug}" / "records"),
                                              "report_path": str(run.work / f"ledger-{slug}" / "report")})
    return config.model_copy(update={"stream": stream, "ledger": ledger})


if __name__ == "__main__":
    main()
